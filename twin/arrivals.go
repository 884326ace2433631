package twin

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/tracefile"
)

// arrivals issues the trace's requests: open loop at their timestamps
// divided by the speedup, or a closed loop of Concurrency clients, each
// issuing its next request when its last one ends (or is rejected).
type arrivals struct {
	reqs    []tracefile.Request
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
	plen := tracefile.TokenLen(rq, t.wl.TraceBlockSize)
	if plen == 0 {
		t.reject(&t.res.RejectedInvalid, atNS, fmt.Sprintf("trace line %d: empty prompt", rq.Line))
		return nil
	}
	rr := t.prompt.request(rq, plen, t.wl.TraceBlockSize)
	t.syncClock()
	bs := t.cfg.BlockSize
	if t.pd != nil {
		if t.prompt.ph == nil {
			// The legs are routed by hashes: hash the expanded prompt once.
			rr.Local = kv.LocalHashes(nil, t.prompt.tok, bs, kv.Seed("", ""))
			rr.Tokens, rr.PromptLen = nil, plen
		}
		tail := t.prompt.tail(rq, kv.NumFullBlocks(plen, bs)*bs, plen)
		return t.arrivePD(ctx, i, atNS, plen, rr, tail)
	}
	return t.route(ctx, i, rq, plen, rr, atNS)
}

// start hands trace request i (plen tokens), routed by d at atNS, to its
// worker; it arrived at arrNS (earlier when it waited in the router
// queue). The prompt buffers must hold its prompt (promptBufs.request).
func (t *twin) start(i int, rq *tracefile.Request, plen int, d *router.Decision, atNS, arrNS int64) error {
	w := int(d.Worker.Instance) - 1
	if w < 0 || w >= len(t.ws) {
		d.Done()
		return fmt.Errorf("twin: router chose unknown worker %v", d.Worker)
	}
	t.touch(w) // d is booked on it
	bs := t.cfg.BlockSize
	at := t.at(atNS)
	tail := t.prompt.tail(rq, len(d.Local)*bs, plen)
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
	st.dec, st.seq, st.arrival = d, s, t.at(arrNS)
	s.Tag = st
	t.predicted += int64(d.CachedTokens)
	t.reachable += int64(d.ReachableTokens)
	if t.q != nil {
		t.qwait = append(t.qwait, ms(time.Duration(atNS-arrNS)))
	}
	t.wake(w, atNS)
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

// request is trace request rq's router request (plen tokens): its
// full-block hashes from the hasher, or else its expanded tokens (kept in
// tok for tail).
func (b *promptBufs) request(rq *tracefile.Request, plen, traceBlockSize int) router.Request {
	rr := router.Request{Model: model}
	if b.ph != nil {
		rr.Local, rr.PromptLen = b.ph.local(rq, plen), plen
	} else {
		b.tok = appendTokens(b.tok[:0], rq, traceBlockSize)
		rr.Tokens = b.tok
	}
	return rr
}

// tail is rq's partial last block, tokens [from, plen) with from an engine
// block boundary, carved for the sim; after request.
func (b *promptBufs) tail(rq *tracefile.Request, from, plen int) []kv.Token {
	if b.ph != nil {
		b.tok = b.ph.appendTail(b.tok[:0], rq, from, plen)
	} else {
		b.tok = b.tok[from:]
	}
	return b.carve(b.tok)
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
