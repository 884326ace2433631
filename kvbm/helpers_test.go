package kvbm

import (
	"fmt"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

const (
	tLayers = 4
	tPsize  = 64
	tBB     = tLayers * tPsize
	tBS     = 4 // tokens per block
)

// fillBlock writes the derived payload of block seq, every layer.
func fillBlock(dst []byte, seq kv.SeqHash) {
	for l := 0; l < tLayers; l++ {
		kv.FillPayload(dst[l*tPsize:(l+1)*tPsize], seq, l)
	}
}

func blockPayload(seq kv.SeqHash) []byte {
	b := make([]byte, tBB)
	fillBlock(b, seq)
	return b
}

// fakeDevice is the engine's KV cache: real bytes per device block, and a
// record of which blocks the engine freed (reading one is a bug).
type fakeDevice struct {
	blocks [][]byte
	free   []DeviceBlockID
	freed  map[DeviceBlockID]bool
}

func newFakeDevice(n int) *fakeDevice {
	d := &fakeDevice{freed: map[DeviceBlockID]bool{}}
	for i := 0; i < n; i++ {
		d.blocks = append(d.blocks, make([]byte, tBB))
		d.free = append(d.free, DeviceBlockID(n-1-i))
		d.freed[DeviceBlockID(i)] = true
	}
	return d
}

func (d *fakeDevice) ReadView(id DeviceBlockID) ([]byte, error) {
	if int(id) >= len(d.blocks) || id < 0 {
		return nil, fmt.Errorf("no device block %d", id)
	}
	if d.freed[id] {
		return nil, fmt.Errorf("device block %d read after the engine freed it", id)
	}
	return d.blocks[id], nil
}

func (d *fakeDevice) WriteView(id DeviceBlockID) ([]byte, error) { return d.ReadView(id) }

func (d *fakeDevice) alloc(t *testing.T, n int) []DeviceBlockID {
	t.Helper()
	if n > len(d.free) {
		t.Fatalf("device out of blocks: want %d, have %d", n, len(d.free))
	}
	ids := make([]DeviceBlockID, n)
	for i := range ids {
		ids[i] = d.free[len(d.free)-1]
		d.free = d.free[:len(d.free)-1]
		d.freed[ids[i]] = false
		clear(d.blocks[ids[i]]) // fresh blocks hold garbage, not the answer
		for j := range d.blocks[ids[i]] {
			d.blocks[ids[i]][j] = 0xEE
		}
	}
	return ids
}

func (d *fakeDevice) release(ids []DeviceBlockID) {
	for _, id := range ids {
		d.freed[id] = true
		d.free = append(d.free, id)
	}
}

// shape is one connector API driven through common verbs, so every
// scenario runs against both.
type shape interface {
	name() string
	match(r *Request, computed int) (int, bool, error)
	// alloc gives a request its blocks: all of them, device hits first.
	alloc(id string, blocks []DeviceBlockID, numExternal, deviceComputed int) error
	step(new, cached []stepReq, sched map[string]int) (*Metadata, error)
	finished(id string) bool
}

type stepReq struct {
	req      *Request // new requests
	id       string
	tokens   []kv.Token      // new: all; cached: since last step
	blocks   []DeviceBlockID // new: all; cached: since last step (all when resumed)
	computed int
	resumed  bool
}

type vllmShape struct{ l *VLLMLeader }

func (vllmShape) name() string { return "vllm" }
func (s vllmShape) match(r *Request, c int) (int, bool, error) {
	return s.l.GetNumNewMatchedTokens(r, c)
}
func (s vllmShape) alloc(id string, b []DeviceBlockID, ext, _ int) error {
	return s.l.UpdateStateAfterAlloc(id, b, ext)
}
func (s vllmShape) step(nw, cached []stepReq, sched map[string]int) (*Metadata, error) {
	out := &VLLMSchedulerOutput{NumScheduledTokens: sched}
	for _, r := range nw {
		out.NewRequests = append(out.NewRequests, VLLMNewRequest{Req: r.req, BlockIDs: r.blocks, NumComputedTokens: r.computed})
	}
	for _, r := range cached {
		out.CachedRequests = append(out.CachedRequests, VLLMCachedRequest{ID: r.id, ResumedFromPreemption: r.resumed,
			NewTokenIDs: r.tokens, NewBlockIDs: r.blocks, NumComputedTokens: r.computed})
	}
	return s.l.BuildConnectorMeta(out)
}
func (s vllmShape) finished(id string) bool { return s.l.RequestFinished(id, nil) }

type trtShape struct{ l *TRTLLMLeader }

func (trtShape) name() string { return "trtllm" }
func (s trtShape) match(r *Request, c int) (int, bool, error) {
	return s.l.GetNumNewMatchedTokens(r, c)
}
func (s trtShape) alloc(id string, b []DeviceBlockID, ext, computed int) error {
	return s.l.UpdateStateAfterAlloc(id, b, computed+ext)
}
func (s trtShape) step(nw, cached []stepReq, sched map[string]int) (*Metadata, error) {
	out := &TRTLLMSchedulerOutput{NumScheduledTokens: sched}
	for _, r := range nw {
		out.NewRequests = append(out.NewRequests, TRTLLMRequestData{ID: r.id, Req: r.req, NewTokens: r.tokens,
			NewBlockIDs: r.blocks, ComputedPosition: r.computed})
	}
	for _, r := range cached {
		if r.resumed {
			// TensorRT-LLM schedules a request back from a pause as a new
			// one, with its whole block list.
			out.NewRequests = append(out.NewRequests, TRTLLMRequestData{ID: r.id, NewTokens: r.tokens,
				NewBlockIDs: r.blocks, ComputedPosition: r.computed})
			continue
		}
		out.CachedRequests = append(out.CachedRequests, TRTLLMRequestData{ID: r.id, NewTokens: r.tokens,
			NewBlockIDs: r.blocks, ComputedPosition: r.computed})
	}
	return s.l.BuildConnectorMeta(out)
}
func (s trtShape) finished(id string) bool { return s.l.RequestFinished(id, nil) }

type rig struct {
	t      *testing.T
	m      *Manager
	c      *Connector
	w      *Worker
	dev    *fakeDevice
	sh     shape
	events []kv.Event
	metas  []*Metadata
}

type rigOpt func(*Config)

func newRig(t *testing.T, mk func(*Connector) shape, hostBlocks, diskBlocks int, opts ...rigOpt) *rig {
	t.Helper()
	r := &rig{t: t, dev: newFakeDevice(64)}
	cfg := Config{BlockSize: tBS, BlockBytes: tBB, Events: func(b []kv.Event) { r.events = append(r.events, b...) }}
	if hostBlocks > 0 {
		h, err := NewHostArena(hostBlocks, tBB)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Host = h
	}
	if diskBlocks > 0 {
		d, err := OpenDiskFile(t.TempDir()+"/g3.pool", diskBlocks, tBB)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		cfg.Disk = d
	}
	for _, o := range opts {
		o(&cfg)
	}
	m, err := NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.m, r.c = m, NewConnector(m)
	r.w = r.c.Worker(r.dev)
	r.sh = mk(r.c)
	return r
}

var shapes = []struct {
	name string
	mk   func(*Connector) shape
}{
	{"vllm", func(c *Connector) shape { return vllmShape{c.VLLMLeader()} }},
	{"trtllm", func(c *Connector) shape { return trtShape{c.TRTLLMLeader()} }},
}

// forEachShape runs a scenario against both connector shapes.
func forEachShape(t *testing.T, f func(t *testing.T, mk func(*Connector) shape)) {
	for _, s := range shapes {
		t.Run(s.name, func(t *testing.T) { f(t, s.mk) })
	}
}

// run is one step of the engine: build the metadata, bind it, run the
// forward pass (fill the KV of every block the step completes), save and
// collect completions.
func (r *rig) run(nw, cached []stepReq, sched map[string]int, forward func()) (md *Metadata, sending, recving []string) {
	r.t.Helper()
	md, err := r.sh.step(nw, cached, sched)
	if err != nil {
		r.t.Fatalf("build meta: %v", err)
	}
	r.metas = append(r.metas, md)
	if err := r.w.BindConnectorMetadata(md); err != nil {
		r.t.Fatalf("bind: %v", err)
	}
	if forward != nil {
		forward()
	}
	r.w.WaitForSave()
	sending, recving, err = r.w.GetFinished()
	if err != nil {
		r.t.Fatalf("get finished: %v", err)
	}
	return md, sending, recving
}

// storedSeqs is every block hash the metadata asks to store.
func storedSeqs(md *Metadata) []kv.SeqHash {
	var out []kv.SeqHash
	for _, op := range md.Ops {
		for _, b := range op.Store {
			out = append(out, b.Meta.Seq)
		}
	}
	return out
}

// req is a synthetic request of n tokens starting at base.
func req(id string, base, n int) *Request {
	toks := make([]kv.Token, n)
	for i := range toks {
		toks[i] = kv.Token(base + i)
	}
	return &Request{ID: id, Tokens: toks}
}

func seqsOf(r *Request) []kv.SeqHash {
	_, seq := kv.NewHasher(tBS, r.LoRA, r.Salt).Blocks(r.Tokens)
	return seq
}

// computeBlocks fills the device blocks [from, to) of a request with the
// KV its tokens derive.
func (r *rig) computeBlocks(blocks []DeviceBlockID, seqs []kv.SeqHash, from, to int) {
	for b := from; b < to && b < len(seqs); b++ {
		fillBlock(r.dev.blocks[blocks[b]], seqs[b])
	}
}

// checkHostHolds verifies the host tier holds exactly want's bytes for each.
func (r *rig) checkTierBytes(t kv.Tier, seqs []kv.SeqHash) {
	r.t.Helper()
	p := r.m.poolOf(t)
	buf := make([]byte, tBB)
	for _, h := range seqs {
		s, ok := p.lookup(h)
		if !ok {
			r.t.Fatalf("%v tier lacks block %016x", t, uint64(h))
		}
		if err := p.store.Get(int(s), buf); err != nil {
			r.t.Fatal(err)
		}
		if string(buf) != string(blockPayload(h)) {
			r.t.Fatalf("%v tier block %016x holds the wrong bytes", t, uint64(h))
		}
		if p.slots[s].meta.Sum != kv.Checksum(buf) {
			r.t.Fatalf("%v tier block %016x: stored checksum does not match", t, uint64(h))
		}
	}
}
