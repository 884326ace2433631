package events

import (
	"context"
	"reflect"
	"testing"

	"go.uber.org/goleak"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/kv"
)

// TestSaltedRoundTripZMQIndex publishes salted and unsalted stores of one
// prompt through the real publisher, decodes them with the subscriber and
// feeds them to the index: each worker's prefix is found only with its own
// LoRA and salt. The salted chain is stored in two events, so the second
// (a continuation, whose wire form names no salt) must inherit it.
func TestSaltedRoundTripZMQIndex(t *testing.T) {
	defer goleak.VerifyNone(t, leakOpts...)
	const bs = 4
	prompt := make([]kv.Token, 4*bs)
	for i := range prompt {
		prompt[i] = kv.Token(1000 + 13*i)
	}
	salted := kv.WorkerKey{Instance: 42, DPRank: 0}   // salt "tenant-a"
	plain := kv.WorkerKey{Instance: 42, DPRank: 1}    // no salt
	loraSalt := kv.WorkerKey{Instance: 42, DPRank: 2} // LoRA "sql-lora", salt "tenant-a"
	ids := map[kv.WorkerKey]uint64{}
	var in []kv.Event
	// store publishes blocks [from, to) of the prompt as one event.
	store := func(w kv.WorkerKey, lora, salt string, from, to int, base uint64) {
		local := kv.NewHasher(bs, lora, salt).Local(prompt)
		blocks := make([]kv.StoredBlock, 0, to-from)
		for b := from; b < to; b++ {
			blocks = append(blocks, kv.StoredBlock{EngineHash: kv.EngineHash(base + uint64(b)), LocalHash: local[b]})
		}
		var parent *kv.EngineHash
		if from > 0 {
			p := kv.EngineHash(base + uint64(from-1))
			parent = &p
		}
		e := kv.Stored(w, kv.TierDevice, parent, blocks)
		e.Tokens, e.LoRA, e.Salt = prompt[from*bs:to*bs], lora, salt
		ids[w]++
		e.ID = ids[w]
		in = append(in, e)
	}
	store(salted, "", "tenant-a", 0, 2, 100)
	store(plain, "", "", 0, 4, 200)
	store(salted, "", "tenant-a", 2, 4, 100)
	store(loraSalt, "sql-lora", "tenant-a", 0, 1, 300)
	store(loraSalt, "sql-lora", "tenant-a", 1, 4, 300)

	for _, shape := range []Shape{ShapeArray, ShapeMapEvents, ShapeMap} {
		t.Run(shape.String(), func(t *testing.T) {
			p, err := NewPublisher(context.Background(), PublisherConfig{
				Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0",
				Shape: shape, BlockSize: bs, Logger: quietLogger(),
			})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			sub, c, stop := runSub(t, Config{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(),
				Instance: 42, BlockSize: bs})
			for i := range in {
				p.Sink(in[i : i+1])
			}
			tickUntil(t, p, func() bool { evs, _ := c.snapshot(); return len(evs) >= len(in) })
			stop()
			got, _ := c.snapshot()
			requireEvents(t, got, in)
			if st := sub.Stats(); st.Malformed+st.Lost+st.DroppedEvents+st.TruncatedStores != 0 {
				t.Fatalf("stats %+v", st)
			}
			ix := index.New()
			for _, e := range got {
				ix.Apply(e)
			}
			full := [kv.NumTiers]uint32{4, 4, 4, 4}
			for _, q := range []struct {
				lora, salt string
				want       []index.Match
			}{
				{"", "tenant-a", []index.Match{{Worker: salted, Depth: full}}},
				{"", "", []index.Match{{Worker: plain, Depth: full}}},
				{"", "tenant-b", nil},
				{"sql-lora", "tenant-a", []index.Match{{Worker: loraSalt, Depth: full}}},
				{"sql-lora", "", nil},
				{"sql-lora", "tenant-b", nil},
			} {
				m := ix.FindMatches(kv.NewHasher(bs, q.lora, q.salt).Local(prompt), nil)
				if !reflect.DeepEqual(m, q.want) {
					t.Errorf("lora %q salt %q: matches %+v, want %+v", q.lora, q.salt, m, q.want)
				}
			}
		})
	}
}
