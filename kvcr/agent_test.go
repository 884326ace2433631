package kvcr

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/events"
	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
)

const bs = 16

// chain is a stored event of n blocks starting at block first of a
// sequence whose tokens are base+i, hashed with SGLang-looking hashes
// (high bit set: negative as int64 on the wire).
func chain(tier kv.Tier, first, n int, base uint32) kv.Event {
	var parent *kv.EngineHash
	if first > 0 {
		p := engineHash(base, first-1)
		parent = &p
	}
	blocks := make([]kv.StoredBlock, n)
	toks := make([]kv.Token, 0, n*bs)
	for i := range n {
		blocks[i] = kv.StoredBlock{EngineHash: engineHash(base, first+i)}
		for j := range bs {
			toks = append(toks, base+uint32((first+i)*bs+j))
		}
	}
	e := kv.Stored(kv.WorkerKey{}, tier, parent, blocks)
	e.Tokens = toks
	return e
}

func engineHash(base uint32, i int) kv.EngineHash {
	return kv.EngineHash(0x8000_0000_0000_0000 | uint64(base)<<20 | uint64(i))
}

func locals(base uint32, n int) []kv.LocalHash {
	out := make([]kv.LocalHash, n)
	for i := range n {
		toks := make([]kv.Token, bs)
		for j := range toks {
			toks[j] = base + uint32(i*bs+j)
		}
		out[i] = kv.HashTokens(toks, kv.Seed("", ""))
	}
	return out
}

// indexSink applies what the agent hands the worker to a router's index,
// as the event plane would.
type indexSink struct {
	mu  sync.Mutex
	ix  *index.Index
	got []kv.Event
}

func (s *indexSink) sink(evs []kv.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range evs {
		s.got = append(s.got, e)
		s.ix.Apply(e)
	}
}

func (s *indexSink) depth(base uint32, n int) [kv.NumTiers]uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.ix.FindMatches(locals(base, n), nil)
	if len(m) == 0 {
		return [kv.NumTiers]uint32{}
	}
	return m[0].Depth
}

func newPublisher(t *testing.T, endpoint string, d Descriptor) *Publisher {
	t.Helper()
	p, err := NewPublisher(context.Background(), PublisherConfig{Endpoint: endpoint, Descriptor: d})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAgentCreditsTiersAndReplacesHoldingsPerEpoch(t *testing.T) {
	d := goodDescriptor()
	d.BlockSize = bs
	pub := newPublisher(t, "tcp://127.0.0.1:0", d)
	ep := pub.Endpoint()
	a, err := NewAgent(AgentConfig{Endpoint: ep, Descriptor: d, Expect: Expect{BlockSize: bs, HashDomain: HashDomainSGLang}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	s := &indexSink{ix: index.New()}
	a.SetEventSink(s.sink)

	// The linker's first epoch: sequence 1 on the device (3 blocks), in
	// KVCR's DRAM (CPU, 2 blocks) and its G3 (STORAGE, 4 blocks).
	first := []kv.Event{chain(kv.TierDevice, 0, 3, 1000), chain(kv.TierHost, 0, 2, 1000), chain(kv.TierDisk, 0, 4, 1000)}
	testutil.WaitFor(t, 5*time.Second, "epoch 1 credited by tier", func() bool {
		_ = pub.Publish(first) // PUB drops until the subscription lands: resend (duplicates are no-ops)
		return s.depth(1000, 4) == [kv.NumTiers]uint32{3, 3, 4, 4}
	}, func() string { return fmtDepth(s.depth(1000, 4)) })
	if st := a.Stats(); st.Held != 9 || st.Epochs != 0 {
		t.Fatalf("after epoch 1: %+v", st)
	}
	// Signed on the wire, the same bits in the index: the agent's removal
	// of a negative hash finds the block.
	if err := pub.Publish([]kv.Event{kv.Removed(kv.WorkerKey{}, kv.TierDisk, []kv.EngineHash{engineHash(1000, 3)})}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "signed-hash removal", func() bool { return s.depth(1000, 4) == [kv.NumTiers]uint32{3, 3, 3, 3} })

	// An unknown medium is dropped and counted, never credited as device.
	if _, err := pub.pub.PublishBatch(&events.Batch{Events: []events.Event{{Type: events.TypeStored, BlockHashes: []kv.EngineHash{engineHash(2000, 0)},
		TokenIDs: make([]uint32, bs), BlockSize: bs, Medium: "TAPE", HasMedium: true}}}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "unknown medium counted", func() bool { return a.Stats().UnknownMedia == 1 })

	// The engine restarts: a new linker process, its sequence from 0. It
	// clears and re-announces what KVCR kept (sequence 1's two host
	// blocks) plus a new sequence on the device.
	pub.Close()
	pub2 := newPublisher(t, ep, d)
	defer pub2.Close()
	testutil.WaitFor(t, 10*time.Second, "epoch 2 replaces epoch 1", func() bool {
		_ = pub2.Clear()
		_ = pub2.Publish([]kv.Event{chain(kv.TierHost, 0, 2, 1000), chain(kv.TierDevice, 0, 2, 3000)})
		return s.depth(1000, 4) == [kv.NumTiers]uint32{0, 2, 2, 2} && s.depth(3000, 2) == [kv.NumTiers]uint32{2, 2, 2, 2}
	}, func() string { return fmtDepth(s.depth(1000, 4)) })
	st := a.Stats()
	if st.Epochs == 0 || st.Released < 8 || st.Held != 4 {
		t.Fatalf("after the restart: %+v (want epochs counted, epoch 1's 8 blocks released, 4 held)", st)
	}
	// Nothing of epoch 1 lingers on any tier, nothing is doubled.
	if c := s.ix.BlockCounts(kv.WorkerKey{Instance: 1}); c != [kv.NumTiers]int{2, 2, 0, 0} {
		t.Fatalf("index holds %v per tier, want device 2, host 2", c)
	}
}

func fmtDepth(d [kv.NumTiers]uint32) string {
	var b strings.Builder
	for t, n := range d {
		b.WriteString(kv.Tier(t).String())
		b.WriteByte('=')
		b.WriteString(strconv.Itoa(int(n)))
		b.WriteByte(' ')
	}
	return b.String()
}

func TestNewAgentValidatesFirst(t *testing.T) {
	d := goodDescriptor()
	d.BlockSize = 64
	if _, err := NewAgent(AgentConfig{Endpoint: "tcp://127.0.0.1:1", Descriptor: d, Expect: Expect{BlockSize: 16, HashDomain: HashDomainSGLang}}); err == nil || !strings.Contains(err.Error(), "block_size 64") {
		t.Fatalf("bad descriptor accepted: %v", err)
	}
	for _, ep := range []string{"tcp://0.0.0.0:5557", "tcp://::1:5557", "tcp://*:5557", ""} {
		_, err := NewAgent(AgentConfig{Endpoint: ep, Descriptor: goodDescriptor(), Expect: Expect{BlockSize: 16, HashDomain: HashDomainSGLang}})
		if err == nil || !strings.Contains(err.Error(), "--kvcr-inventory-endpoint") {
			t.Errorf("endpoint %q: %v, want an error naming --kvcr-inventory-endpoint", ep, err)
		}
	}
}
