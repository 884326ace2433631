package sim

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
)

// localPuller pulls a handoff straight from the prefill engine's cache (the
// transfer path is the worker's; see worker.Peer.PullHandoff).
func localPuller(src *Engine, fail error) HandoffPuller {
	return func(_ context.Context, req *engine.Request, h *Handoff, m Missing, into Inserter) (int, int64, error) {
		if fail != nil {
			return 0, 0, fail
		}
		c := src.SimConfig()
		ch := Chain{HasParent: m.HasParent, Parent: m.Parent}
		for i, s := range m.Seq {
			if i+m.Start >= len(h.Hashes) || h.Hashes[i+m.Start] != EngineHash(s) {
				break
			}
			bd := BlockData{Local: m.Local[i], Seq: s}
			for l := range c.Layers {
				buf := make([]byte, c.PayloadSize)
				if _, err := src.ReadPayload(s, l, buf); err != nil {
					return 0, 0, err
				}
				bd.Layers = append(bd.Layers, buf)
				bd.Sums = append(bd.Sums, kv.Checksum(buf))
			}
			ch.Blocks = append(ch.Blocks, bd)
		}
		src.HandoffServed(m.Seq[:len(ch.Blocks)])
		n, err := into.Insert(ch)
		return n, int64(n * c.Layers * c.PayloadSize), err
	}
}

func legPair(t *testing.T, ttl time.Duration, fail error) (pre, dec *Engine) {
	cfg := testConfig()
	cfg.SpeedupRatio = 0
	cfg.Disagg = DisaggConfig{TTL: ttl, Endpoint: func(r int) string { return "tcp://127.0.0.1:1" }}
	pre = mustEngine(t, cfg)
	dcfg := testConfig()
	dcfg.SpeedupRatio = 0
	dcfg.Worker = kv.WorkerKey{Instance: 8}
	dcfg.Disagg.Puller = localPuller(pre, fail)
	dec = mustEngine(t, dcfg)
	return pre, dec
}

func tokens(n, seed int) []kv.Token {
	out := make([]kv.Token, n)
	for i := range out {
		out[i] = kv.Token(seed*7919 + i*13)
	}
	return out
}

func TestPrefillDecodeLegs(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		fail      error
		badParams bool
		cached    int
	}{
		{"pulled", nil, false, 40},
		{"pull fails: recompute", errors.New("source gone"), false, 0},
		{"bad params: recompute", nil, true, 0},
	} {
		pre, dec := legPair(t, time.Minute, tc.fail)
		p := tokens(42, 1) // 10 full blocks of 4
		r := req("r1", p, 8)
		r.Leg = kv.LegPrefill
		ch, err := pre.Generate(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		toks, last := collect(t, ch)
		if len(toks) != 1 || last.Finish != kv.FinishLength || last.TransferParams == nil {
			t.Fatalf("%s: prefill answered %v %+v", tc.name, toks, last)
		}
		h, err := ParseHandoff(last.TransferParams)
		if err != nil || h.RequestID != "r1" || len(h.Hashes) != 10 || h.Endpoint != "tcp://127.0.0.1:1" {
			t.Fatalf("%s: handoff %+v %v", tc.name, h, err)
		}
		if st := pre.HandoffStats(); st.PinnedBlocks != 10 || st.PinnedHandoffs != 1 || st.Prefills != 1 {
			t.Fatalf("%s: prefill stats %+v", tc.name, st)
		}
		d := req("r1", p, 8)
		d.Leg, d.TransferParams = kv.LegDecode, last.TransferParams
		if tc.badParams {
			d.TransferParams = []byte(`{"kvmesh_sim_handoff":99}`)
		}
		ch, err = dec.Generate(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		dt, dl := collect(t, ch)
		// The decode leg generates the whole answer, equal to an
		// aggregated run's.
		agg, _ := collect(t, must(dec.Generate(ctx, req("agg", p, 8))))
		if dl.Finish != kv.FinishLength || !slices.Equal(dt, agg) || dl.Usage.CachedTokens != tc.cached {
			t.Fatalf("%s: decode %v %+v (usage %+v), aggregated %v", tc.name, dt, dl, dl.Usage, agg)
		}
		st := dec.HandoffStats()
		wantRecompute := uint64(0)
		if tc.cached == 0 {
			wantRecompute = 1
		}
		if st.Decodes != 1 || st.Recomputes != wantRecompute || (tc.fail != nil) != (st.Failures == 1) {
			t.Fatalf("%s: decode stats %+v", tc.name, st)
		}
		if tc.cached > 0 {
			if st.PullBytes == 0 || st.PulledBlks != 10 {
				t.Fatalf("%s: pulled %+v", tc.name, st)
			}
			// The read released the pin.
			if st := pre.HandoffStats(); st.PinnedBlocks != 0 || st.Read != 1 {
				t.Fatalf("%s: after the read %+v", tc.name, st)
			}
		}
	}
}

func must(ch <-chan engine.Chunk, err error) <-chan engine.Chunk {
	if err != nil {
		panic(err)
	}
	return ch
}

// An unread handoff is released at its expiry; a final prefill (one token
// wanted, or a stop token) pins nothing and carries no parameters.
func TestHandoffExpiryAndFinalPrefill(t *testing.T) {
	ctx := context.Background()
	pre, _ := legPair(t, 50*time.Millisecond, nil)
	r := req("x", tokens(20, 2), 5)
	r.Leg = kv.LegPrefill
	_, last := collect(t, must(pre.Generate(ctx, r)))
	if last.TransferParams == nil || pre.HandoffStats().PinnedBlocks != 5 {
		t.Fatalf("prefill %+v stats %+v", last, pre.HandoffStats())
	}
	testutil.WaitFor(t, 5*time.Second, "handoff expiry", func() bool { return pre.HandoffStats().PinnedBlocks == 0 })
	if st := pre.HandoffStats(); st.Expired != 1 || st.PinnedHandoffs != 0 {
		t.Fatalf("after expiry %+v", st)
	}
	one := req("y", tokens(20, 3), 1)
	one.Leg = kv.LegPrefill
	toks, last := collect(t, must(pre.Generate(ctx, one)))
	if len(toks) != 1 || last.TransferParams != nil {
		t.Fatalf("max_tokens 1 prefill: %v %+v", toks, last)
	}
	// A stop token as the one token: final too.
	probe := req("z", tokens(20, 4), 5)
	first, _ := collect(t, must(pre.Generate(ctx, probe)))
	stop := req("z2", tokens(20, 4), 5)
	stop.Leg, stop.StopTokens = kv.LegPrefill, []kv.Token{first[0]}
	_, last = collect(t, must(pre.Generate(ctx, stop)))
	if last.Finish != kv.FinishStop || last.TransferParams != nil {
		t.Fatalf("stop-token prefill %+v", last)
	}
	if st := pre.HandoffStats(); st.FinalPrefills != 2 || st.PinnedBlocks != 0 {
		t.Fatalf("final prefills %+v", st)
	}
}

// A decode leg that did not read the handoff's last block tells the
// prefill side it is done, which unpins at once (long before the TTL):
// when it held every block already, and when its pull failed. One that
// read the last block sends nothing: the read released the pin.
func TestDecodeReleasesHandoff(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name                  string
		fail                  error
		warm                  bool
		wantRelease, wantRead uint64
	}{
		{"held every block", nil, true, 1, 0},
		{"pull failed", errors.New("source gone"), false, 1, 0},
		{"pulled through the last block", nil, false, 0, 1},
	} {
		pre, dec := legPair(t, time.Minute, tc.fail)
		dec.cfg.Disagg.Release = func(_ context.Context, h *Handoff) error {
			if h.Endpoint != "tcp://127.0.0.1:1" {
				return errors.New("wrong endpoint")
			}
			pre.ReleaseHandoff(h.RequestID)
			return nil
		}
		p := tokens(42, 5)
		if tc.warm {
			collect(t, must(dec.Generate(ctx, req("warm", p, 2))))
		}
		r := req("r", p, 8)
		r.Leg = kv.LegPrefill
		_, last := collect(t, must(pre.Generate(ctx, r)))
		d := req("r", p, 8)
		d.Leg, d.TransferParams = kv.LegDecode, last.TransferParams
		collect(t, must(dec.Generate(ctx, d)))
		testutil.WaitFor(t, 5*time.Second, tc.name+": pin released", func() bool { return pre.HandoffStats().PinnedBlocks == 0 })
		st, ds := pre.HandoffStats(), dec.HandoffStats()
		if st.Released != tc.wantRelease || st.Read != tc.wantRead || st.Expired != 0 || ds.ReleasesSent != tc.wantRelease || ds.ReleaseErrors != 0 {
			t.Fatalf("%s: prefill %+v, decode %+v", tc.name, st, ds)
		}
		if pre.ReleaseHandoff("r") {
			t.Fatalf("%s: a second release found a pin", tc.name)
		}
	}
}
