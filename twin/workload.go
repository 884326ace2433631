package twin

import (
	"fmt"
	"slices"
	"sync"

	"github.com/kvmesh/kvmesh/internal/mix"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/tracefile"
)

// Workload is a parsed trace ready to replay: its requests in arrival order
// (stable by timestamp) and the lines that were skipped as malformed.
type Workload struct {
	TraceBlockSize int
	Requests       []tracefile.Request
	Skipped        []tracefile.LineError

	// Prompt hashers kept between runs, by (trace, engine) block size: a
	// hash id's block hashes do not depend on the run, so runs after the
	// first (--compare, benchmarks) hash nothing the workload already had.
	mu      sync.Mutex
	hashers map[[2]int]*promptHasher
}

// takeHasher hands a run the workload's prompt hasher for engine blocks of
// bs tokens (a new one if none is idle; concurrent runs each get their
// own), or nil when engine blocks straddle trace blocks.
func (w *Workload) takeHasher(bs int) *promptHasher {
	k := [2]int{w.TraceBlockSize, bs}
	w.mu.Lock()
	h := w.hashers[k]
	delete(w.hashers, k)
	w.mu.Unlock()
	if h != nil {
		return h
	}
	return newPromptHasher(w.TraceBlockSize, bs)
}

// putHasher keeps h for the next run, unless one that has hashed more is
// kept already.
func (w *Workload) putHasher(h *promptHasher) {
	if h == nil {
		return
	}
	k := [2]int{h.tbs, h.bs}
	w.mu.Lock()
	defer w.mu.Unlock()
	if o := w.hashers[k]; o != nil && o.n >= h.n {
		return
	}
	if w.hashers == nil {
		w.hashers = map[[2]int]*promptHasher{}
	}
	w.hashers[k] = h
}

// LoadOptions control LoadWorkload.
type LoadOptions struct {
	TraceBlockSize int  // tokens per hash id; default 512
	Strict         bool // the first malformed line fails the load
	MaxRequests    int  // stop after this many non-empty lines (0: all)
}

// LoadWorkload parses the trace at path. Malformed lines are kept in
// Skipped (with their line numbers), unless opt.Strict, where the first one
// is the error.
func LoadWorkload(path string, opt LoadOptions) (*Workload, error) {
	if opt.TraceBlockSize == 0 {
		opt.TraceBlockSize = tracefile.DefaultTraceBlockSize
	}
	if opt.TraceBlockSize < 0 || opt.MaxRequests < 0 {
		return nil, fmt.Errorf("twin: trace block size %d and max requests %d must not be negative", opt.TraceBlockSize, opt.MaxRequests)
	}
	reqs, errs, err := tracefile.Load(path, tracefile.Options{Strict: opt.Strict, TraceBlockSize: opt.TraceBlockSize, MaxLines: opt.MaxRequests})
	if err != nil {
		return nil, fmt.Errorf("twin: %w", err)
	}
	return NewWorkload(reqs, errs, opt.TraceBlockSize)
}

// NewWorkload wraps already parsed requests (copied, then sorted stably by
// timestamp).
func NewWorkload(reqs []tracefile.Request, skipped []tracefile.LineError, traceBlockSize int) (*Workload, error) {
	if traceBlockSize <= 0 {
		return nil, fmt.Errorf("twin: trace block size %d, want ≥ 1", traceBlockSize)
	}
	rs := slices.Clone(reqs)
	slices.SortStableFunc(rs, func(a, b tracefile.Request) int {
		switch {
		case a.TimestampMS < b.TimestampMS:
			return -1
		case a.TimestampMS > b.TimestampMS:
			return 1
		}
		return 0
	})
	return &Workload{TraceBlockSize: traceBlockSize, Requests: rs, Skipped: skipped}, nil
}

// appendTokens appends req's prompt tokens to dst: hash id h fills its
// trace block with tokens derived from a 64-bit key k = mix(h), alternating
// low and high halves of k plus the position (k.lo+0, k.hi+1, k.lo+2, …).
// Every run of two or more tokens thus carries all of k and its offset, so
// distinct (id, offset) pairs give distinct engine blocks with
// overwhelming probability, and equal ids give equal tokens. This is the
// twin's own expansion, not tracefile.Token: the router rehashes every prompt
// in every mode, and tracefile.Token's two mixing rounds per token cost about a
// quarter of a second per pass over the conversation trace; this costs one
// mix per 512 tokens.
func appendTokens(dst []kv.Token, req *tracefile.Request, tbs int) []kv.Token {
	n := tracefile.TokenLen(req, tbs)
	dst = slices.Grow(dst, n)
	for i := 0; n > 0; i++ {
		m := min(n, tbs)
		dst = appendTraceBlock(dst, req.HashIDs[i], m)
		n -= m
	}
	return dst
}

// appendTraceBlock appends the first m tokens of hash id h's trace block.
func appendTraceBlock(dst []kv.Token, h uint64, m int) []kv.Token {
	lo, hi := blockKey(h)
	j := 0
	for ; j+1 < m; j += 2 {
		dst = append(dst, lo+uint32(j), hi+uint32(j+1))
	}
	if j < m {
		dst = append(dst, lo+uint32(j))
	}
	return dst
}

// blockKey is the key k = mix(h) of hash id h's trace block, as halves.
func blockKey(h uint64) (lo, hi uint32) {
	k := mix.Mix64(h + mix.Golden)
	return uint32(k), uint32(k >> 32)
}

// blockToken is token j of the trace block keyed (lo, hi).
func blockToken(lo, hi uint32, j int) kv.Token {
	if j&1 == 0 {
		return lo + uint32(j)
	}
	return hi + uint32(j)
}

// rng64 is a splitmix64 stream for request seeds.
func rng64(seed uint64, i int) uint64 {
	return mix.Mix64(seed + uint64(i+1)*mix.Golden)
}
