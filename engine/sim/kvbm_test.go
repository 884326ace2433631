package sim

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/clock"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/kvbm"
	"github.com/kvmesh/kvmesh/kvbm/blobtier"
)

// tierLog replays a core's event stream per tier, checking one gap-free
// numbering across tiers.
type tierLog struct {
	t      *testing.T
	nextID uint64
	held   [kv.NumTiers]map[kv.EngineHash]bool
}

func newTierLog(t *testing.T) *tierLog {
	l := &tierLog{t: t, nextID: 1}
	for i := range l.held {
		l.held[i] = map[kv.EngineHash]bool{}
	}
	return l
}

func (l *tierLog) sink(batch []kv.Event) {
	l.t.Helper()
	for _, e := range batch {
		if e.ID != l.nextID {
			l.t.Fatalf("event id %d (tier %v), want %d", e.ID, e.Tier, l.nextID)
		}
		l.nextID++
		switch e.Kind {
		case kv.EventStored:
			for _, b := range e.Blocks {
				l.held[e.Tier][b.EngineHash] = true
			}
		case kv.EventRemoved:
			for _, h := range e.Removed {
				if !l.held[e.Tier][h] {
					l.t.Fatalf("removed %016x from %v, not held there", h, e.Tier)
				}
				delete(l.held[e.Tier], h)
			}
		}
	}
}

func kvbmConfig(host, disk int, dir string) Config {
	cfg := testConfig()
	cfg.Blocks = 16
	cfg.StoreChecksums = true
	cfg.KVBM = &KVBMConfig{HostBlocks: host, DiskBlocks: disk, DiskDir: dir,
		DiskFilter: kvbm.FilterConfig{Disabled: true}}
	return cfg
}

func prompt(base, n int) []kv.Token {
	toks := make([]kv.Token, n)
	for i := range toks {
		toks[i] = kv.Token(base*1000 + i)
	}
	return toks
}

// run adds req and steps the core until it finishes.
func run(t *testing.T, c *Core, id string, toks []kv.Token, maxTok int, now *time.Time) *Seq {
	t.Helper()
	s, err := c.Add(req(id, toks, maxTok), *now)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; !s.Done(); i++ {
		if i > 1000 {
			t.Fatal("request never finished")
		}
		r := c.Step(*now)
		*now = r.End
	}
	if err := c.KVBMErr(); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestKVBMHostTierServesEvictedPrefix(t *testing.T) {
	c := mustCore(t, kvbmConfig(64, 0, ""))
	log := newTierLog(t)
	c.SetEventSink(log.sink)
	now := clock.Epoch
	a := prompt(1, 40) // 10 full blocks of 4
	run(t, c, "a", a, 2, &now)
	// Two other prompts evict a's blocks from the 16-block device pool.
	run(t, c, "b", prompt(2, 40), 2, &now)
	run(t, c, "c", prompt(3, 40), 2, &now)
	if n := c.Lookup(hashes(t, a, 4)); n != 0 {
		t.Fatalf("device still holds %d of a's blocks", n)
	}
	again := run(t, c, "a2", a, 2, &now)
	m := again.Metrics()
	// 10 blocks, the last one is computed so the engine gets logits.
	if m.HostTokens != 36 || m.CachedTokens != 36 || m.DiskTokens != 0 {
		t.Fatalf("host %d disk %d cached %d tokens, want 36, 0, 36", m.HostTokens, m.DiskTokens, m.CachedTokens)
	}
	if u := again.Usage(); u.CachedTokens != 36 {
		t.Fatalf("usage cached %d", u.CachedTokens)
	}
	// Same output as computed from scratch.
	if got, want := again.Output(), refOutput(a, 1, "", "", 2, 4, 1000, nil); !equalTokens(got, want) {
		t.Fatalf("output %v, want %v", got, want)
	}
	st := c.KVBMStats()
	if st.OnboardedHost != 9 || st.HostTokens != 36 || st.Corrupt != 0 || st.ConnectorErrors != 0 {
		t.Fatalf("stats %+v", st)
	}
	// The event stream (one numbering) says what each tier holds.
	for _, h := range hashes(t, a, 4) {
		if host, _ := c.HoldsTier(h); !host || !log.held[kv.TierHost][kv.EngineHash(h)] {
			t.Fatalf("block %016x: host holds %v, events say %v", h, host, log.held[kv.TierHost][kv.EngineHash(h)])
		}
	}
	if len(log.held[kv.TierHost]) != st.HostBlocks {
		t.Fatalf("events say host holds %d blocks, it holds %d", len(log.held[kv.TierHost]), st.HostBlocks)
	}
	// Inventory lists the host tier too.
	var inv int
	for _, e := range c.Inventory() {
		if e.Tier == kv.TierHost {
			inv += len(e.Blocks)
		}
	}
	if inv != st.HostBlocks {
		t.Fatalf("inventory lists %d host blocks, want %d", inv, st.HostBlocks)
	}
}

func TestKVBMDiskRecoveryDropsCorruptBlock(t *testing.T) {
	dir := t.TempDir()
	cfg := kvbmConfig(0, 64, dir) // bypass host: device → disk
	c := mustCore(t, cfg)
	now := clock.Epoch
	a := prompt(1, 40)
	run(t, c, "a", a, 2, &now)
	if st := c.KVBMStats(); st.DiskBlocks != 10 {
		t.Fatalf("disk holds %d blocks, want 10", st.DiskBlocks)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Corrupt the block in slot 5 (blocks were stored in order).
	files, _ := filepath.Glob(filepath.Join(dir, "*.g3"))
	if len(files) != 1 {
		t.Fatalf("disk files %v", files)
	}
	df, err := kvbm.OpenDiskFile(files[0], 64, cfg.Layers*cfg.PayloadSize)
	if err != nil {
		t.Fatal(err)
	}
	off := df.PayloadOffset(5)
	df.Close()
	f, err := os.OpenFile(files[0], os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0xde, 0xad}, off+3); err != nil {
		t.Fatal(err)
	}
	f.Close()

	c2 := mustCore(t, cfg)
	defer c2.Close()
	st := c2.KVBMStats()
	if st.RecoveredDisk != 9 || st.RecoveredCorrupt != 1 || st.DiskBlocks != 9 {
		t.Fatalf("recovered %d, corrupt %d, holds %d; want 9, 1, 9", st.RecoveredDisk, st.RecoveredCorrupt, st.DiskBlocks)
	}
	// The recovered blocks are announced once a sink is installed.
	log := newTierLog(t)
	c2.SetEventSink(log.sink)
	if len(log.held[kv.TierDisk]) != 9 {
		t.Fatalf("announced %d disk blocks, want 9", len(log.held[kv.TierDisk]))
	}
	again := run(t, c2, "a2", a, 2, &now)
	// The prefix up to the corrupt block loads from disk.
	if m := again.Metrics(); m.DiskTokens != 20 || m.CachedTokens != 20 {
		t.Fatalf("disk %d cached %d tokens, want 20, 20", m.DiskTokens, m.CachedTokens)
	}
	if got, want := again.Output(), refOutput(a, 1, "", "", 2, 4, 1000, nil); !equalTokens(got, want) {
		t.Fatalf("output %v, want %v", got, want)
	}
}

func TestNoKVBMReportsNoTiers(t *testing.T) {
	c := mustCore(t, testConfig())
	if got := c.TierLoadMS(); got != ([kv.NumTiers]float64{}) || c.OnboardBacklog(clock.Epoch) != 0 {
		t.Fatalf("without kvbm: tier load %v, backlog %v", got, c.OnboardBacklog(clock.Epoch))
	}
	cfg := kvbmConfig(64, 0, "")
	cfg.KVBM.HostBandwidth = -1 // free, but known: not 0
	if got := mustCore(t, cfg).TierLoadMS(); !(got[kv.TierHost] > 0 && got[kv.TierHost] < 1e-3) {
		t.Fatalf("free host tier reports %v ms per block", got[kv.TierHost])
	}
	// The config-only answer is the core's.
	cfg = kvbmConfig(64, 8, t.TempDir())
	cfg.KVBM.DiskBandwidth = 1e9
	if got, want := KVBMTierLoadMS(cfg), mustCore(t, cfg).TierLoadMS(); got != want || !(want[kv.TierDisk] > want[kv.TierHost]) {
		t.Fatalf("KVBMTierLoadMS %v, core %v", got, want)
	}
	if got := KVBMTierLoadMS(testConfig()); got != ([kv.NumTiers]float64{}) {
		t.Fatalf("without kvbm: %v", got)
	}
}

func TestKVBMRefusedOnDecodeWorkers(t *testing.T) {
	cfg := kvbmConfig(8, 0, "")
	cfg.Role = kv.RoleDecode
	if _, err := NewCore(cfg); err == nil {
		t.Fatal("a decode worker accepted a block manager")
	}
}

func hashes(t *testing.T, toks []kv.Token, bs int) []kv.SeqHash {
	t.Helper()
	return kv.SeqHashes(nil, kv.LocalHashes(nil, toks, bs, kv.Seed("", "")))
}

func equalTokens(a, b []kv.Token) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestKVBMPinServesHostTier: a pin continues past the device prefix into
// the host tier, whose pinned blocks a peer reads (view, copy, checksum)
// with the bytes the device computed.
func TestKVBMPinServesHostTier(t *testing.T) {
	c := mustCore(t, kvbmConfig(64, 0, ""))
	now := clock.Epoch
	a := prompt(1, 40)
	run(t, c, "a", a, 2, &now)
	run(t, c, "b", prompt(2, 40), 2, &now)
	run(t, c, "c", prompt(3, 40), 2, &now)
	seqs := hashes(t, a, 4)
	if _, err := c.ViewBlock(seqs[0]); err == nil {
		t.Fatal("view of an unpinned block")
	}
	n, release := c.Pin(seqs)
	if n != len(seqs) || c.Lookup(seqs) != 0 {
		t.Fatalf("pinned %d of %d blocks (device holds %d)", n, len(seqs), c.Lookup(seqs))
	}
	want := make([]byte, c.cfg.PayloadSize)
	for i, h := range seqs {
		v, err := c.ViewBlock(h)
		if err != nil {
			t.Fatal(err)
		}
		for l := range c.cfg.Layers {
			kv.FillPayload(want, h, l)
			if string(v[l*c.cfg.PayloadSize:(l+1)*c.cfg.PayloadSize]) != string(want) {
				t.Fatalf("block %d layer %d: host bytes differ from the derivation", i, l)
			}
			got := make([]byte, c.cfg.PayloadSize)
			if _, err := c.ReadPayload(h, l, got); err != nil || string(got) != string(want) {
				t.Fatalf("ReadPayload block %d layer %d: %v", i, l, err)
			}
		}
		if sum, ok := c.BlockChecksum(h); !ok || sum != kv.Checksum(v) {
			t.Fatalf("block %d: checksum %016x %v, bytes %016x", i, sum, ok, kv.Checksum(v))
		}
	}
	release()
	release()
	if _, err := c.ViewBlock(seqs[0]); err == nil {
		t.Fatal("view after the pin was released")
	}
}

// TestKVBMCorruptHostBlockIsRecomputed: a host block whose bytes rotted
// fails verification on the device; it is dropped and counted, the engine
// recomputes from it, the answer is unchanged, only the blocks before it
// count as cached, and the recomputed block is offloaded to host again.
func TestKVBMCorruptHostBlockIsRecomputed(t *testing.T) {
	c := mustCore(t, kvbmConfig(64, 0, ""))
	now := clock.Epoch
	a := prompt(1, 40)
	run(t, c, "a", a, 2, &now)
	run(t, c, "b", prompt(2, 40), 2, &now)
	run(t, c, "c", prompt(3, 40), 2, &now)
	seqs := hashes(t, a, 4)
	staged := c.kb.mgr.PinHost(nil, seqs[4:5])
	v, _, err := c.kb.mgr.HostView(seqs[4])
	if err != nil {
		t.Fatal(err)
	}
	v[7] ^= 0xff
	c.kb.mgr.Release(staged)
	again := run(t, c, "a2", a, 2, &now)
	m := again.Metrics()
	if m.HostTokens != 16 || m.CachedTokens != 16 {
		t.Fatalf("host %d cached %d tokens, want the 16 before the corrupt block", m.HostTokens, m.CachedTokens)
	}
	if got, want := again.Output(), refOutput(a, 1, "", "", 2, 4, 1000, nil); !equalTokens(got, want) {
		t.Fatalf("output %v, want %v", got, want)
	}
	st := c.KVBMStats()
	if st.Corrupt != 1 || st.LoadFailures == 0 {
		t.Fatalf("stats %+v", st)
	}
	// What a2 recomputed went to the host tier again: the corrupt block
	// is offloaded anew, the rest were still there.
	for i, h := range seqs {
		if host, _ := c.HoldsTier(h); !host {
			t.Fatalf("host tier lacks block %d after the recompute", i)
		}
	}
	// The recomputed blocks are on the device with the right bytes.
	n, release := c.Pin(seqs)
	defer release()
	if n != len(seqs) {
		t.Fatalf("pinned %d of %d after recompute", n, len(seqs))
	}
	want := make([]byte, c.cfg.PayloadSize)
	kv.FillPayload(want, seqs[4], 0)
	if v, err := c.ViewBlock(seqs[4]); err != nil || string(v[:c.cfg.PayloadSize]) != string(want) {
		t.Fatalf("block 4 after recompute: %v", err)
	}
}

// TestKVBMOnboardingOverlapsOtherRequests: a request whose prefix comes
// from the host tier takes no part of the pass that admits it; its load
// runs beside the other requests' passes (their time is not lengthened by
// it) and it is scheduled in the first pass that starts once the load has
// landed. Aborting a request while it loads frees everything.
func TestKVBMOnboardingOverlapsOtherRequests(t *testing.T) {
	c := mustCore(t, kvbmConfig(64, 0, ""))
	now := clock.Epoch
	a := prompt(1, 40)
	run(t, c, "a", a, 2, &now)
	run(t, c, "b", prompt(2, 40), 2, &now)
	run(t, c, "c", prompt(3, 40), 2, &now)

	// d decodes long enough to keep the engine busy.
	d, err := c.Add(req("d", prompt(4, 4), 16), now)
	if err != nil {
		t.Fatal(err)
	}
	for d.Metrics().FirstToken.IsZero() {
		now = c.Step(now).End
	}
	decodePass := c.Step(now)
	decodeDur := decodePass.Duration
	now = decodePass.End
	// a's 9 host blocks take 3.5 decode passes to onboard.
	loadMS := 3.5 * float64(decodeDur) / float64(time.Millisecond)
	c.kb.hostBW = 9 * c.kb.bpb / (loadMS / 1e3)

	a2, err := c.Add(req("a2", a, 2), now)
	if err != nil {
		t.Fatal(err)
	}
	admitted := now
	r := c.Step(now)
	// Priced with the load, the pass would take 4.5 decode passes.
	if r.Seqs != 1 || r.Loading != 1 || r.Duration > decodeDur*3/2 {
		t.Fatalf("admitting pass: %d seqs, %d loading, %v (a decode-only pass takes %v)", r.Seqs, r.Loading, r.Duration, decodeDur)
	}
	if st := c.Stats(); st.Running != 2 || st.Waiting != 0 {
		t.Fatalf("stats while loading %+v", st)
	}
	ready := admitted.Add(msToDuration(loadMS))
	// What the router reads: a host block's load time, and the channel
	// busy until a2's load lands, draining as time passes.
	if got := c.TierLoadMS(); math.Abs(got[kv.TierHost]-loadMS/9) > 1e-9 || got[kv.TierDevice] != 0 {
		t.Fatalf("tier load times %v, want host %v ms", got, loadMS/9)
	}
	if got := c.OnboardBacklog(admitted); got != ready.Sub(admitted) {
		t.Fatalf("backlog at admission %v, want %v", got, ready.Sub(admitted))
	}
	if got := c.OnboardBacklog(r.End); got != ready.Sub(r.End) {
		t.Fatalf("backlog after a pass %v, want %v", got, ready.Sub(r.End))
	}
	if got := c.OnboardBacklog(ready.Add(time.Millisecond)); got != 0 {
		t.Fatalf("backlog after the load landed %v", got)
	}
	now = r.End
	for a2.Metrics().FirstToken.IsZero() {
		start := now
		r := c.Step(now)
		now = r.End
		ranA2 := r.Loading == 0
		if ranA2 != !start.Before(ready) {
			t.Fatalf("pass at +%v (load lands at +%v): %d seqs, %d loading", start.Sub(admitted), ready.Sub(admitted), r.Seqs, r.Loading)
		}
		if ranA2 && r.Seqs != 2 {
			t.Fatalf("a2's first pass schedules %d requests", r.Seqs)
		}
	}
	if m := a2.Metrics(); m.HostTokens != 36 || m.CachedTokens != 36 {
		t.Fatalf("a2 host %d cached %d tokens, want 36", m.HostTokens, m.CachedTokens)
	}
	for !a2.Done() {
		now = c.Step(now).End
	}
	if got, want := a2.Output(), refOutput(a, 1, "", "", 2, 4, 1000, nil); !equalTokens(got, want) {
		t.Fatalf("output %v, want %v", got, want)
	}

	// Abort while loading: blocks and tier pins are released.
	a3, err := c.Add(req("a3", prompt(2, 40), 2), now)
	if err != nil {
		t.Fatal(err)
	}
	if r := c.Step(now); r.Loading != 1 || a3.st != stLoading {
		t.Fatalf("a3 not loading: %d loading, state %v", r.Loading, a3.st)
	}
	if !c.Abort(a3, now) || c.Abort(a3, now) {
		t.Fatal("abort while loading")
	}
	if !c.Abort(d, now) {
		t.Fatal("abort d")
	}
	if !c.Idle() {
		t.Fatal("core not idle after aborting everything")
	}
	checkPool(t, c, nil)
	if err := c.KVBMErr(); err != nil {
		t.Fatal(err)
	}
	if n := c.kb.conn.Slots(); n != 0 {
		t.Fatalf("connector tracks %d slots after every request ended", n)
	}
}

// TestKVBMObjectTierServesHostEvictionsAndSurvivesRestart: with a host tier
// too small for the workload, what host evicts goes to the object tier
// (file:// bucket); a repeat loads it back (priced, verified, same answer),
// and a core restarted with the same worker key recovers the objects.
func TestKVBMObjectTierServesHostEvictionsAndSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := kvbmConfig(8, 0, "")
	cfg.KVBM.Objects, cfg.KVBM.ObjectBlocks = objectsAt("file://"+dir, 0), 64
	c := mustCore(t, cfg)
	log := newTierLog(t)
	c.SetEventSink(log.sink)
	now := clock.Epoch
	a := prompt(1, 40)
	run(t, c, "a", a, 2, &now)
	run(t, c, "b", prompt(2, 40), 2, &now)
	run(t, c, "c", prompt(3, 40), 2, &now)
	seqs := hashes(t, a, 4)
	for i, h := range seqs[:9] {
		if !c.kb.mgr.HoldsObject(h) || !log.held[kv.TierExternal][kv.EngineHash(h)] {
			t.Fatalf("block %d of a: object tier holds %v, events say %v", i, c.kb.mgr.HoldsObject(h), log.held[kv.TierExternal][kv.EngineHash(h)])
		}
	}
	again := run(t, c, "a2", a, 2, &now)
	m := again.Metrics()
	if m.ObjectTokens == 0 || m.HostTokens+m.ObjectTokens != 36 || m.CachedTokens != 36 {
		t.Fatalf("a2: host %d object %d cached %d tokens, want 36 from host and object", m.HostTokens, m.ObjectTokens, m.CachedTokens)
	}
	if got, want := again.Output(), refOutput(a, 1, "", "", 2, 4, 1000, nil); !equalTokens(got, want) {
		t.Fatalf("output %v, want %v", got, want)
	}
	st := c.KVBMStats()
	if st.OffloadedObject == 0 || st.OnboardedObject == 0 || st.ObjectTokens == 0 || st.Corrupt != 0 {
		t.Fatalf("stats %+v", st)
	}
	held := st.ObjectBlocks
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	c2 := mustCore(t, cfg)
	defer c2.Close()
	log2 := newTierLog(t)
	c2.SetEventSink(log2.sink)
	if st := c2.KVBMStats(); st.RecoveredObject != uint64(held) || st.ObjectBlocks != held {
		t.Fatalf("restart recovered %d of %d object blocks (%+v)", st.RecoveredObject, held, st)
	}
	if n := len(log2.held[kv.TierExternal]); n != held {
		t.Fatalf("restart announced %d object blocks, want %d", n, held)
	}
	b2 := run(t, c2, "b2", prompt(2, 40), 2, &now)
	if m := b2.Metrics(); m.ObjectTokens == 0 {
		t.Fatalf("after the restart b2 loaded nothing from the object tier: %+v", m)
	}
}

// TestKVBMAsyncObjectWrites: with an object queue the engine's evictions
// are written by the object tier's own goroutines; each block is announced
// on the external tier once written, also after the last request ended
// (the idle engine settles on the tier's signal), and a repeat loads them.
func TestKVBMAsyncObjectWrites(t *testing.T) {
	cfg := kvbmConfig(8, 0, "")
	cfg.SpeedupRatio = 0
	cfg.KVBM.Objects, cfg.KVBM.ObjectBlocks = objectsAt("mem://", 32), 64
	e := mustEngine(t, cfg)
	var mu sync.Mutex
	log := newTierLog(t)
	e.SetEventSink(func(b []kv.Event) { mu.Lock(); log.sink(b); mu.Unlock() })
	gen := func(id string, toks []kv.Token) []kv.Token {
		ch, err := e.Generate(context.Background(), &engine.Request{ID: id, Tokens: toks, Sampling: kv.Sampling{MaxTokens: 2}})
		if err != nil {
			t.Fatal(err)
		}
		out, _ := collect(t, ch)
		return out
	}
	a := prompt(1, 40)
	first := gen("a", a)
	gen("b", prompt(2, 40))
	gen("c", prompt(3, 40))
	seqs := hashes(t, a, 4)
	testutil.WaitFor(t, 10*time.Second, "every write done, a's blocks announced on the object tier", func() bool {
		if e.KVBMStats().PendingObject != 0 {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		for _, h := range seqs[:9] {
			if !log.held[kv.TierExternal][kv.EngineHash(h)] {
				return false
			}
		}
		return true
	}, func() string { return fmt.Sprintf("%+v", e.KVBMStats()) })
	st := e.KVBMStats()
	if st.PendingObject != 0 || st.OffloadedObject == 0 || st.DroppedObject != 0 || st.FailedObject != 0 {
		t.Fatalf("stats %+v", st)
	}
	if again := gen("a2", a); !equalTokens(again, first) {
		t.Fatalf("repeat answered %v, first %v", again, first)
	}
	if st := e.KVBMStats(); st.OnboardedObject == 0 {
		t.Fatalf("the repeat loaded nothing from the object tier: %+v", st)
	}
}

// TestKVBMLoadsOnlyWhatBeatsRecompute: a disk tier so slow that loading a
// block takes longer than recomputing its tokens is not loaded: the repeat
// recomputes (same answer, nothing cached) and the declined blocks are
// counted; without a recompute cost every match loads.
func TestKVBMLoadsOnlyWhatBeatsRecompute(t *testing.T) {
	for _, c := range []struct {
		name      string
		recompute time.Duration
		disk      int // tokens loaded from disk
		declined  uint64
	}{
		{"sim's prefill model", RecomputeAuto, 0, 9},
		{"configured figure", time.Second, 36, 0},
		{"off", 0, 36, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := kvbmConfig(0, 64, t.TempDir())
			bpb := float64(cfg.Layers * cfg.PayloadSize)
			// One block's load takes a second: far dearer than 4 tokens' prefill.
			cfg.KVBM.DiskBandwidth = bpb
			cfg.KVBM.RecomputePerToken = c.recompute
			core := mustCore(t, cfg)
			defer core.Close()
			now := clock.Epoch
			a := prompt(1, 40)
			run(t, core, "a", a, 2, &now)
			// Two more prompts push a off the 16-block device.
			run(t, core, "b", prompt(2, 40), 2, &now)
			run(t, core, "c", prompt(3, 40), 2, &now)
			again := run(t, core, "a2", a, 2, &now)
			m, st := again.Metrics(), core.KVBMStats()
			if m.DiskTokens != c.disk || st.DeclinedLoad != c.declined {
				t.Fatalf("disk tokens %d, declined %d blocks; want %d, %d (%+v)", m.DiskTokens, st.DeclinedLoad, c.disk, c.declined, st)
			}
			if got, want := again.Output(), refOutput(a, 1, "", "", 2, 4, 1000, nil); !equalTokens(got, want) {
				t.Fatalf("output %v, want %v", got, want)
			}
		})
	}
}

func TestRecomputeCost(t *testing.T) {
	// Polynomial over an 8192-token chunk: (P(8192) − P(1)) / 8191 ms, by hand
	// 4.209989e-07·8193 + 1.518344e-02 = 0.018632 ms.
	got := RecomputeCost(Polynomial{}, 8192)
	if want := 18632 * time.Nanosecond; got < want-time.Nanosecond || got > want+time.Nanosecond {
		t.Fatalf("RecomputeCost = %v, want %v", got, want)
	}
	if got := RecomputeCost(nil, 1); got != msToDuration(PrefillMS(1)) {
		t.Fatalf("a one-token chunk: %v", got)
	}
}

// objectsAt opens object tiers in the bucket at url, as kvmesh does, with
// writes behind a queue of queue blocks (0: synchronous).
func objectsAt(url string, queue int) ObjectOpener {
	return func(prefix string, slots, blockBytes int) (ObjectTier, error) {
		return blobtier.OpenTier(context.Background(), url, prefix, slots, blockBytes, queue)
	}
}
