package kvbm

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

func TestLoadPrefix(t *testing.T) {
	const us = time.Microsecond
	const H, D, O = kv.TierHost, kv.TierDisk, kv.TierExternal
	// 16-token blocks at 10 µs a token: recomputing a block costs 160 µs.
	cost := LoadCost{PerBlock: [kv.NumTiers]time.Duration{H: 50 * us, D: 200 * us, O: 900 * us}, RecomputeToken: 10 * us}
	for _, c := range []struct {
		name    string
		cost    LoadCost
		tiers   []kv.Tier
		backlog time.Duration
		want    int
	}{
		{"unknown recompute cost: load all", LoadCost{PerBlock: cost.PerBlock}, []kv.Tier{O, O, O}, time.Second, 3},
		{"nothing matched", cost, nil, 0, 0},
		{"host saves 110 µs a block", cost, []kv.Tier{H, H, H}, 0, 3},
		// +110, +220, then disk −40 each: 180, 140.
		{"host, then dearer disk", cost, []kv.Tier{H, H, D, D}, 0, 2},
		// −40 each.
		{"disk only, dearer than recompute", cost, []kv.Tier{D, D}, 0, 0},
		{"object behind host", cost, []kv.Tier{H, O}, 0, 1},
		// −250 + 110 + 110 = −30: waiting for the queue costs more.
		{"backlog eats the saving", cost, []kv.Tier{H, H}, 250 * us, 0},
		// −250 + 330 = +80.
		{"a longer match pays the backlog", cost, []kv.Tier{H, H, H}, 250 * us, 3},
		// −220 + 220 = 0: a tie is not worth waiting for.
		{"tie", cost, []kv.Tier{H, H}, 220 * us, 0},
		// −40, +70, +180: the dear block is worth it for what follows.
		{"dear block first", cost, []kv.Tier{D, H, H}, 0, 3},
		// +110, +220, −40×5 = 20 at the end: the best is still 2.
		{"long dear tail", cost, []kv.Tier{H, H, D, D, D, D, D}, 0, 2},
		{"negative backlog is none", cost, []kv.Tier{H}, -time.Second, 1},
		{"free tiers", LoadCost{RecomputeToken: us}, []kv.Tier{H, D, O}, 0, 3},
		{"an invalid tier costs nothing", cost, []kv.Tier{kv.Tier(kv.NumTiers)}, 0, 1},
	} {
		if got := c.cost.LoadPrefix(c.tiers, 16, c.backlog); got != c.want {
			t.Errorf("%s: LoadPrefix(%v, backlog %v) = %d, want %d", c.name, c.tiers, c.backlog, got, c.want)
		}
	}
}

// TestMatchLoadsOnlyWhatIsCheaperThanRecompute: a prompt whose first half
// is in host and second half on disk only, with disk loads dearer than
// recomputing: the match stops where host stops (the disk blocks are
// declined, counted and left unpinned); a big enough backlog declines the
// host blocks too; without a recompute cost every block loads, as before.
func TestMatchLoadsOnlyWhatIsCheaperThanRecompute(t *testing.T) {
	forEachShape(t, func(t *testing.T, mk func(*Connector) shape) {
		r := newRig(t, mk, 16, 16, func(c *Config) { c.DiskFilter.Disabled = true })
		q := req("a", 100, 8*tBS+2)
		r.prefill(q, nil, 1000)
		r.sh.finished("a")
		seqs := seqsOf(q)
		for _, h := range seqs[4:] {
			s, _ := r.m.host.lookup(h)
			r.m.host.drop(s)
		}
		if host, disk := r.m.Holds(seqs[4]); host || !disk {
			t.Fatalf("block 4: host %v disk %v, want disk only", host, disk)
		}
		rc := 10 * time.Microsecond
		var backlog time.Duration
		r.c.SetLoadCost(LoadCost{PerBlock: [kv.NumTiers]time.Duration{kv.TierHost: time.Microsecond, kv.TierDisk: tBS*rc + 1}, RecomputeToken: rc},
			func() time.Duration { return backlog })

		n, async, err := r.sh.match(req("b", 100, 8*tBS+2), 0)
		if err != nil || n != 4*tBS || !async {
			t.Fatalf("match: %d tokens %v %v, want the 4 host blocks' %d", n, async, err, 4*tBS)
		}
		st := r.m.Stats()
		if st.MatchedHost != 4 || st.MatchedDisk != 0 || st.DeclinedLoad != 4 {
			t.Fatalf("stats %+v: want 4 matched host, 4 declined disk blocks", st)
		}
		for i, h := range seqs[4:8] {
			if s, _ := r.m.disk.lookup(h); r.m.disk.slots[s].ref != 0 {
				t.Fatalf("declined disk block %d still pinned", i+4)
			}
		}
		r.sh.finished("b")

		// 4 host blocks save 4·(40−1) µs: a longer backlog than that
		// makes recomputing everything quicker.
		backlog = 4 * (tBS*rc - time.Microsecond)
		if n, _, err := r.sh.match(req("c", 100, 8*tBS+2), 0); err != nil || n != 0 {
			t.Fatalf("match behind a %v backlog: %d tokens, %v; want none", backlog, n, err)
		}
		if st := r.m.Stats(); st.DeclinedLoad != 4+8 {
			t.Fatalf("declined %d blocks, want 4 then 8", st.DeclinedLoad)
		}
		r.sh.finished("c")

		r.c.SetLoadCost(LoadCost{PerBlock: [kv.NumTiers]time.Duration{kv.TierDisk: time.Hour}}, nil)
		if n, _, err := r.sh.match(req("d", 100, 8*tBS+2), 0); err != nil || n != 8*tBS {
			t.Fatalf("match without a recompute cost: %d tokens, %v; want all %d", n, err, 8*tBS)
		}
		r.sh.finished("d")
	})
}
