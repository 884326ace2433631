package kvbm

import (
	"fmt"

	"github.com/kvmesh/kvmesh/kv"
)

// Request is what the connector needs to know of a request when the
// engine first asks it for matches.
type Request struct {
	ID         string
	Tokens     []kv.Token // every token known so far (the prompt, plus outputs after a preemption)
	LoRA, Salt string     // mixed into the block hashes' seed (kv.Seed)
	Priority   uint32     // retention priority of its offloaded blocks: lower is evicted first
	// GenerationOnly marks the decode side of a disaggregated pair: its
	// prompt KV arrives from the prefill worker, so the connector matches
	// nothing for it.
	GenerationOnly bool
	// Len > 0 gives the request by hashes instead of Tokens (an engine
	// that, like the sim replaying a trace, has no tokens for its prompt):
	// Len tokens are known and Local holds the local hashes of all their
	// full blocks. Such a request is given by hashes for its whole life.
	Len   int
	Local []kv.LocalHash
}

// Phase is where a request's slot stands.
type Phase uint8

const (
	PhaseNew           Phase = iota // created by a match call, nothing staged
	PhaseOnboardStaged              // matched blocks pinned, waiting for the engine's allocation
	PhaseOnboarding                 // a load op is issued, not yet completed
	PhasePrefilling
	PhaseDecoding
	PhasePreempted // the engine freed its device blocks; it will be matched again
	PhaseFinishing // finished, with ops still in flight: the engine delays freeing its blocks
)

var phaseNames = [...]string{"new", "onboard-staged", "onboarding", "prefilling", "decoding", "preempted", "finishing"}

func (p Phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase(%d)", uint8(p))
}

// slot is one request's connector state: its tokens and block hashes, the
// device blocks the engine gave it, how far its KV is computed (current)
// and how many leading blocks were already considered for offload
// (evaluated), so that nothing is offloaded twice.
type slot struct {
	id       string
	seed     uint64
	priority uint32
	genOnly  bool
	tokens   []kv.Token // nil when given by hashes
	n        int        // tokens known
	hashed   bool       // given by hashes (Request.Len)
	local    []kv.LocalHash
	seq      []kv.SeqHash
	blocks   []DeviceBlockID

	current   int // tokens whose KV is (or after this step will be) on the device
	evaluated int // leading full blocks already offloaded or skipped
	phase     Phase

	staged    []Staged // pinned matches, PhaseOnboardStaged
	matchFrom int      // first matched block index (the device hit)
	loadFrom  int      // tokens on the device before the load, PhaseOnboarding
	pending   int      // ops issued and not completed

	loadedHost, loadedDisk int // blocks onboarded from each tier
	loadedObject           int
}

func newSlot(r *Request, bs int) *slot {
	s := &slot{id: r.ID, seed: kv.Seed(r.LoRA, r.Salt), priority: r.Priority, genOnly: r.GenerationOnly, hashed: r.Len > 0}
	s.setRequest(r, bs)
	return s
}

// setRequest brings the slot up to what r knows.
func (s *slot) setRequest(r *Request, bs int) {
	if s.hashed {
		s.setHashed(r.Len, r.Local)
	} else {
		s.setTokens(r.Tokens, bs)
	}
}

// setHashed makes the slot know n tokens whose full blocks have the local
// hashes local (a longer list extends the slot's).
func (s *slot) setHashed(n int, local []kv.LocalHash) {
	if n <= s.n {
		return
	}
	s.n = n
	for b := len(s.local); b < len(local); b++ {
		h := kv.SeqHash(local[b])
		if b > 0 {
			h = kv.ChainHash(s.seq[b-1], local[b])
		}
		s.local = append(s.local, local[b])
		s.seq = append(s.seq, h)
	}
}

// setTokens makes toks the request's tokens (a longer list extends them).
func (s *slot) setTokens(toks []kv.Token, bs int) {
	if len(toks) <= s.n {
		return
	}
	s.appendTokens(toks[s.n:], bs)
}

// appendTokens adds tokens and hashes the blocks they complete.
func (s *slot) appendTokens(toks []kv.Token, bs int) {
	s.tokens = append(s.tokens, toks...)
	s.n = len(s.tokens)
	for b := len(s.local); (b+1)*bs <= len(s.tokens); b++ {
		l := kv.HashTokens(s.tokens[b*bs:(b+1)*bs], s.seed)
		h := kv.SeqHash(l)
		if b > 0 {
			h = kv.ChainHash(s.seq[b-1], l)
		}
		s.local = append(s.local, l)
		s.seq = append(s.seq, h)
	}
}

func (s *slot) meta(b int) BlockMeta {
	m := BlockMeta{Seq: s.seq[b], Local: s.local[b], Priority: s.priority}
	if b > 0 {
		m.Parent, m.HasParent = s.seq[b-1], true
	}
	return m
}

// SlotInfo is a snapshot of one request's connector state.
type SlotInfo struct {
	Phase        Phase
	Tokens       int
	DeviceBlocks []DeviceBlockID
	Current      int // tokens computed on the device as the connector counts them
	Evaluated    int // leading blocks already offloaded or skipped
	Pending      int // ops in flight
	// LoadedHost, LoadedDisk and LoadedObject are the tokens onboarded
	// from each tier.
	LoadedHost, LoadedDisk, LoadedObject int
}
