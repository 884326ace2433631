package sim

import (
	"math/bits"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/internal/mix"
	"github.com/kvmesh/kvmesh/kv"
)

type seqState uint8

const (
	stWaiting seqState = iota
	stRunning
	stLoading // admitted, its matched blocks onboarding (Config.KVBM)
	stFinished
)

// Metrics are one request's timings and counts.
type Metrics struct {
	Arrival    time.Time // when Add was called
	Scheduled  time.Time // start of the pass that first scheduled it
	FirstToken time.Time // end of the pass that sampled its first token
	Finished   time.Time // end of the pass that sampled its last token (or abort time)

	PromptTokens  int
	OutputTokens  int
	CachedTokens  int // prompt tokens found in the cache at first admission (fetched ones included)
	FetchedTokens int // prompt tokens the Fetcher brought in for it
	// With a block manager (Config.KVBM): prompt tokens matched in its
	// tiers at first admission, and of those onboarded from host, disk and
	// the object tier (all included in CachedTokens once loaded).
	ExternalTokens, HostTokens, DiskTokens int
	ObjectTokens                           int
	Preemptions                            int
	Finish                                 kv.FinishReason
}

// Seq is one request inside a Core. Its methods are safe to call from the
// goroutine driving the Core (or under the Engine's lock).
type Seq struct {
	req       *engine.Request
	promptLen int
	prompt    []kv.Token // nil when added by hashes (AddPrompt)
	tail      []kv.Token // prompt tokens after its last full block
	out       []kv.Token
	seed      uint64 // local-hash seed: LoRA and cache salt

	// Hashes of every full block of prompt+output known so far.
	local []kv.LocalHash
	seqh  []kv.SeqHash

	table      []int32 // block table
	nReg       int     // leading table entries that are registered cache blocks
	computed   int     // tokens whose KV is in the table
	prefillEnd int     // tokens to compute before sampling, set at (re)admission
	decoding   bool    // prefill done and not preempted since
	st         seqState
	admitted   bool

	// Context state of the deterministic "model": the sequence hash of the
	// last full block and a rolling hash of the tokens after it.
	ctxSeq  kv.SeqHash
	ctxTail uint64

	pendingXfer int64 // modelled transfer bytes charged to its first pass
	prepaid     bool  // Prompt.Prepaid: fetched blocks cost nothing in-pass

	kb *kbReq // connector state (Config.KVBM)

	m Metrics

	// Tag is free for the driver (the Engine keeps its stream here).
	Tag any
}

// ID is the request's id.
func (s *Seq) ID() string { return s.req.ID }

// Request is the request as added.
func (s *Seq) Request() *engine.Request { return s.req }

// Output returns the tokens generated so far (shared; do not modify).
func (s *Seq) Output() []kv.Token { return s.out }

// Metrics returns a copy of the request's metrics.
func (s *Seq) Metrics() Metrics { return s.m }

// Done reports whether the request finished or was aborted.
func (s *Seq) Done() bool { return s.st == stFinished }

// Usage is the request's token accounting.
func (s *Seq) Usage() engine.Usage {
	u := engine.Usage{PromptTokens: s.promptLen, CompletionTokens: len(s.out), CachedTokens: s.m.CachedTokens,
		HostCachedTokens: s.m.HostTokens, DiskCachedTokens: s.m.DiskTokens, ObjectCachedTokens: s.m.ObjectTokens}
	// Fetched blocks count as cached once admitted; one evicted before
	// that was recomputed, so the peer share is at most what the lower
	// tiers leave of the cached prefix.
	u.PeerCachedTokens = max(min(s.m.FetchedTokens, u.CachedTokens-u.HostCachedTokens-u.DiskCachedTokens-u.ObjectCachedTokens), 0)
	return u
}

func (s *Seq) total() int { return s.promptLen + len(s.out) }

// blockTokens returns the tokens of full block b (nil for a prompt block of
// a prompt given by hashes), using scratch when the block straddles prompt
// and output.
func (s *Seq) blockTokens(b, bs int, scratch []kv.Token) []kv.Token {
	lo, hi, p := b*bs, (b+1)*bs, s.promptLen
	switch {
	case hi <= p:
		if s.prompt == nil {
			return nil
		}
		return s.prompt[lo:hi]
	case lo >= p:
		return s.out[lo-p : hi-p]
	}
	// The block starts at the prompt's tail.
	scratch = append(scratch[:0], s.tail...)
	return append(scratch, s.out[:hi-p]...)
}

const tailInit = 0x6a09e667f3bcc909

func rollTail(h uint64, t kv.Token) uint64 {
	return bits.RotateLeft64((h^uint64(t))*mix.Golden, 31)
}

// NextToken is the sim's deterministic "model": the token after a context
// whose last full block has sequence hash ctxSeq (0 for none) and whose
// partial tail rolled into ctxTail, for a request seed, in [0, vocab). It
// depends only on the context, so a request migrated with its generated
// tokens appended to the prompt continues exactly where it stopped.
func NextToken(seed uint64, ctxSeq kv.SeqHash, ctxTail uint64, vocab uint32) kv.Token {
	x := mix.Mix64(uint64(ctxSeq) ^ bits.RotateLeft64(ctxTail, 17) ^ (seed+1)*0xD6E8FEB86659FD93)
	hi, _ := bits.Mul64(x, uint64(vocab))
	return kv.Token(hi)
}
