package twin

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/trace"
)

// arrivals issues the trace's requests: open loop at their timestamps
// divided by the speedup, or a closed loop of Concurrency clients, each
// issuing its next request when its last one ends (or is rejected).
type arrivals struct {
	reqs    []trace.Request
	speedup float64
	closed  bool  // a closed loop
	ts0     int64 // first trace timestamp
	next    int   // next trace request to issue
	// Open loop: the arrival time of request cachedNext.
	cachedNext int
	cachedAt   int64
	cachedOK   bool
	issue      []int64
	head       int // closed loop: issue[head:] are pending client issue times
}

func newArrivals(wl *Workload, cfg Config) arrivals {
	a := arrivals{reqs: wl.Requests, speedup: cfg.ArrivalSpeedup, closed: cfg.Concurrency > 0, cachedNext: -1}
	if len(wl.Requests) > 0 {
		a.ts0 = wl.Requests[0].TimestampMS
	}
	if a.closed {
		for range min(cfg.Concurrency, len(wl.Requests)) {
			a.issue = append(a.issue, 0)
		}
	}
	return a
}

// peek is when the next request is issued, if any is left.
func (a *arrivals) peek() (int64, bool) {
	if !a.closed && a.next == a.cachedNext {
		return a.cachedAt, a.cachedOK
	}
	at, ok := a.compute()
	if !a.closed {
		a.cachedNext, a.cachedAt, a.cachedOK = a.next, at, ok
	}
	return at, ok
}

func (a *arrivals) compute() (int64, bool) {
	if a.next >= len(a.reqs) {
		return 0, false
	}
	if a.closed {
		if a.head < len(a.issue) {
			return a.issue[a.head], true
		}
		return 0, false
	}
	ms := float64(a.reqs[a.next].TimestampMS - a.ts0)
	return int64(time.Duration(ms * float64(time.Millisecond) / a.speedup)), true
}

// take issues the next request and returns its index.
func (a *arrivals) take() int {
	i := a.next
	a.next++
	if a.closed {
		a.head++
	}
	return i
}

// reissue: in a closed loop, the client whose request ended (or was
// rejected) issues its next one at atNS.
func (a *arrivals) reissue(atNS int64) {
	if a.closed {
		a.issue = append(a.issue, atNS)
	}
}

// arrive routes the next trace request at atNS and hands it to its worker.
func (t *twin) arrive(ctx context.Context, atNS int64) error {
	i := t.arr.take()
	t.advance(atNS)
	at := t.at(atNS)
	if t.firstAt.IsZero() {
		t.firstAt = at
	}
	rq := &t.wl.Requests[i]
	plen := trace.TokenLen(rq, t.wl.TraceBlockSize)
	if plen == 0 {
		t.reject(&t.res.RejectedInvalid, atNS, fmt.Sprintf("trace line %d: empty prompt", rq.Line))
		return nil
	}
	rr := router.Request{Model: model}
	if t.prompt.ph != nil {
		rr.Local, rr.PromptLen = t.prompt.ph.local(rq, plen), plen
	} else {
		t.prompt.tok = appendTokens(t.prompt.tok[:0], rq, t.wl.TraceBlockSize)
		rr.Tokens = t.prompt.tok
	}
	t.syncClock()
	if t.pd != nil {
		from := kv.NumFullBlocks(plen, t.cfg.BlockSize) * t.cfg.BlockSize
		if t.prompt.ph != nil {
			t.prompt.tok = t.prompt.ph.appendTail(t.prompt.tok[:0], rq, from, plen)
		} else {
			rr.Local = kv.LocalHashes(nil, t.prompt.tok, t.cfg.BlockSize, kv.Seed("", ""))
			rr.Tokens, rr.PromptLen = nil, plen
			t.prompt.tok = t.prompt.tok[from:]
		}
		return t.arrivePD(ctx, i, atNS, plen, rr, t.prompt.carve(t.prompt.tok))
	}
	d, err := t.r.Route(ctx, rr)
	if err != nil {
		var be *kv.BusyError
		if errors.As(err, &be) {
			t.reject(&t.res.RejectedBusy, atNS+int64(be.RetryAfter), "")
			return nil
		}
		return fmt.Errorf("twin: route trace line %d: %w", rq.Line, err)
	}
	w := int(d.Worker.Instance) - 1
	if w < 0 || w >= len(t.ws) {
		d.Done()
		return fmt.Errorf("twin: router chose unknown worker %v", d.Worker)
	}
	from := len(d.Local) * t.cfg.BlockSize
	if t.prompt.ph != nil {
		t.prompt.tok = t.prompt.ph.appendTail(t.prompt.tok[:0], rq, from, plen)
	} else {
		t.prompt.tok = t.prompt.tok[from:]
	}
	tail := t.prompt.carve(t.prompt.tok)
	st := &t.reqs[i]
	st.er = engine.Request{ID: strconv.Itoa(rq.Line), Sampling: kv.Sampling{MaxTokens: max(rq.OutputLength, 1), Seed: rng64(t.cfg.Seed, i)}}
	st.er.KVHint = d.Hint // for the Fetcher
	if d.Hint != nil {
		t.res.Hints.Hints++
		t.res.Hints.PlannedBlocks += int64(len(d.Hint.Hashes) - int(d.Overlap[kv.NumTiers-1]))
	}
	s, err := t.ws[w].core.AddPrompt(&st.er, sim.Prompt{Len: plen, Local: d.Local, Tail: tail, Seq: d.Seq}, at)
	if err != nil {
		d.Done()
		t.reject(&t.res.RejectedInvalid, atNS, err.Error())
		return nil
	}
	st.dec, st.seq, st.arrival = d, s, at
	s.Tag = st
	t.predicted += int64(d.CachedTokens)
	if wk := &t.ws[w]; !wk.active {
		wk.active, wk.pending, wk.at, wk.atNS = true, false, at, atNS
	}
	return nil
}

// reject counts a request that was not served; a closed-loop client issues
// its next request at retry.
func (t *twin) reject(counter *int, retry int64, why string) {
	*counter++
	if why != "" && len(t.res.RejectReasons) < 10 {
		t.res.RejectReasons = append(t.res.RejectReasons, why)
	}
	t.arr.reissue(retry)
}

// promptBufs builds each arrival's prompt: its hashes (ph, or expanded
// tokens in tok) and its partial last block, carved from a slab.
type promptBufs struct {
	ph    *promptHasher // nil: expand and hash every prompt
	tok   []kv.Token
	tails []kv.Token // slab the prompts' partial tails are carved from
}

// carve copies a prompt's partial last block into the tail slab: the sim
// keeps the slice until the request ends.
func (b *promptBufs) carve(src []kv.Token) []kv.Token {
	if len(src) == 0 {
		return nil
	}
	if cap(b.tails)-len(b.tails) < len(src) {
		b.tails = make([]kv.Token, 0, max(64<<10, len(src)))
	}
	n := len(b.tails)
	b.tails = append(b.tails, src...)
	return b.tails[n:len(b.tails):len(b.tails)]
}
