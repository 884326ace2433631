package sim

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/clock"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/kv"
)

// Engine is the simulated engine behind engine.Engine: one goroutine steps
// the Core, waiting each pass's modelled time (÷ SpeedupRatio) on the
// configured clock, and each request's stream is pumped by its own
// goroutine, so a slow reader never stalls the batch.
//
// With Config.DPSize > 1 the Engine is rank 0 and the front of the other
// ranks, each a whole Engine of its own (Rank): Generate runs a request on
// its Request.DPRank, and Stats, Counters, SetEventSink and Close cover
// every rank (RankStats is one rank's load). The cache methods (Lookup,
// Pin, ReadPayload, ViewBlock, BlockChecksum, Insert) are always the
// receiving rank's own.
type Engine struct {
	cfg  Config
	clk  clock.Clock
	wake chan struct{}
	rank int       // this rank's index
	dp   []*Engine // every rank (dp[0] is e) when DPSize > 1; nil with one

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex // guards core and closed
	core   *Core
	closed bool

	ho handoffs // prefill/decode legs (disagg.go)
}

var _ engine.Engine = (*Engine)(nil)
var _ engine.Ranked = (*Engine)(nil)
var _ engine.Inventory = (*Engine)(nil)
var _ Inserter = (*Engine)(nil)

// New starts a simulated engine with cfg.DPSize ranks.
func New(cfg Config) (*Engine, error) {
	n := max(cfg.DPSize, 1)
	if n == 1 {
		return newRank(cfg, 0)
	}
	dp := make([]*Engine, 0, n)
	for r := range n {
		rc := cfg
		rc.Worker.DPRank = uint32(r)
		e, err := newRank(rc, r)
		if err != nil {
			for _, e := range dp {
				e.closeRank()
			}
			return nil, err
		}
		dp = append(dp, e)
	}
	dp[0].dp = dp
	return dp[0], nil
}

// newRank starts one rank: a Core and the loop that steps it.
func newRank(cfg Config, rank int) (*Engine, error) {
	core, err := NewCore(cfg)
	if err != nil {
		return nil, err
	}
	e := &Engine{cfg: core.cfg, clk: core.cfg.Clock, core: core, rank: rank, wake: make(chan struct{}, 1)}
	if core.kb != nil {
		// Loads are timed on the clock the Engine waits on: divided by
		// the speedup like its passes, free when it does not wait.
		core.kb.loadScale = 0
		if core.cfg.SpeedupRatio > 0 {
			core.kb.loadScale = 1 / core.cfg.SpeedupRatio
		}
	}
	if e.clk == nil {
		e.clk = clock.NewWall()
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.wg.Add(1)
	go e.loop()
	return e, nil
}

// DPSize is the number of ranks this Engine fronts (1 for Rank(r), r > 0).
func (e *Engine) DPSize() int { return max(len(e.dp), 1) }

// Rank is rank r's Engine (e itself for 0), or nil if there is no rank r.
func (e *Engine) Rank(r int) *Engine {
	switch {
	case e.dp != nil && r >= 0 && r < len(e.dp):
		return e.dp[r]
	case e.dp == nil && r == e.rank:
		return e
	}
	return nil
}

// ranks are the ranks this Engine covers.
func (e *Engine) ranks() []*Engine {
	if e.dp == nil {
		return []*Engine{e}
	}
	return e.dp
}

// Config is the engine's static description.
func (e *Engine) Config() engine.Config { return e.cfg.Config }

// SimConfig is the full (normalised) sim configuration.
func (e *Engine) SimConfig() Config { return e.cfg }

// Stats is the load right now, summed over the ranks.
func (e *Engine) Stats() engine.Stats {
	if e.dp == nil {
		return e.ownStats()
	}
	var t engine.Stats
	for _, r := range e.dp {
		s := r.ownStats()
		t.Running += s.Running
		t.Waiting += s.Waiting
		t.UsedBlocks += s.UsedBlocks
		t.TotalBlocks += s.TotalBlocks
		t.PendingPrefillTokens += s.PendingPrefillTokens
	}
	return t
}

// RankStats is rank r's load (zero for a rank that does not exist).
func (e *Engine) RankStats(r int) engine.Stats {
	if re := e.Rank(r); re != nil {
		return re.ownStats()
	}
	return engine.Stats{}
}

func (e *Engine) ownStats() engine.Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.core.Stats()
}

// Counters returns the cores' running totals, summed over the ranks.
func (e *Engine) Counters() Counters {
	var t Counters
	for _, r := range e.ranks() {
		r.mu.Lock()
		t.add(r.core.Counters())
		r.mu.Unlock()
	}
	return t
}

// SetEventSink installs where KV events go; the sink is called with the
// rank's lock held, so it must not call back into the engine, and with
// several ranks it is called from each rank's loop concurrently.
func (e *Engine) SetEventSink(sink engine.EventSink) {
	for _, r := range e.ranks() {
		r.mu.Lock()
		r.core.SetEventSink(sink)
		r.mu.Unlock()
	}
}

// Inventory implements engine.Inventory: rank's pool (Core.Inventory),
// listed under the rank's lock, which its events also reach the sink under,
// so at sees the event stream exactly where the list was taken.
func (e *Engine) Inventory(rank int, at func()) ([]kv.Event, bool) {
	r := e.Rank(rank)
	if r == nil {
		return nil, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	evs := r.core.Inventory()
	if at != nil {
		at()
	}
	return evs, true
}

// Lookup counts the leading cached blocks of seqs.
func (e *Engine) Lookup(seqs []kv.SeqHash) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.core.Lookup(seqs)
}

// Pin holds the leading cached blocks of seqs until release is called.
func (e *Engine) Pin(seqs []kv.SeqHash) (int, func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	n, rel := e.core.Pin(seqs)
	var once sync.Once
	return n, func() {
		once.Do(func() {
			e.mu.Lock()
			rel()
			e.mu.Unlock()
			e.poke()
		})
	}
}

// PinBlocks is Pin that also returns the pinned blocks' pool ids (see
// Core.PinBlocks).
func (e *Engine) PinBlocks(seqs []kv.SeqHash) ([]int32, func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ids, rel := e.core.PinBlocks(seqs)
	var once sync.Once
	return ids, func() {
		once.Do(func() {
			e.mu.Lock()
			rel()
			e.mu.Unlock()
			e.poke()
		})
	}
}

// ReadPayload copies a cached block's layer payload into dst.
func (e *Engine) ReadPayload(seq kv.SeqHash, layer int, dst []byte) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.core.ReadPayload(seq, layer, dst)
}

// Insert commits fetched blocks into the cache (see Core.Insert).
func (e *Engine) Insert(ch Chain) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.core.Insert(ch)
}

// Close stops the engine (every rank): every open stream ends with
// ErrClosed.
func (e *Engine) Close() error {
	for _, r := range e.ranks() {
		r.closeRank()
	}
	return nil
}

func (e *Engine) closeRank() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	e.mu.Unlock()
	e.cancel()
	e.wg.Wait()
	e.mu.Lock()
	_ = e.core.Close() // a disk tier not synced costs only recomputes
	e.mu.Unlock()
}

func (e *Engine) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// stream is a request's outbox between the stepping loop and its pump.
type stream struct {
	mu     sync.Mutex
	toks   []kv.Token
	finish kv.FinishReason
	usage  engine.Usage
	notify chan struct{}
}

func (st *stream) push(tok kv.Token, fin kv.FinishReason, u engine.Usage) {
	st.mu.Lock()
	st.toks = append(st.toks, tok)
	if fin != kv.FinishNone {
		st.finish, st.usage = fin, u
	}
	st.mu.Unlock()
	select {
	case st.notify <- struct{}{}:
	default:
	}
}

func (st *stream) take() ([]kv.Token, kv.FinishReason, engine.Usage) {
	st.mu.Lock()
	defer st.mu.Unlock()
	t := st.toks
	st.toks = nil
	return t, st.finish, st.usage
}

// Generate starts a request on rank req.DPRank; see engine.Engine.
func (e *Engine) Generate(ctx context.Context, req *engine.Request) (<-chan engine.Chunk, error) {
	if req == nil {
		return nil, errors.New("sim: nil request")
	}
	if req.DPRank != e.rank || e.dp != nil {
		r := e.Rank(req.DPRank)
		if r == nil {
			return nil, fmt.Errorf("sim: no dp rank %d here (dp size %d)", req.DPRank, e.DPSize())
		}
		e = r
	}
	if req.Leg == kv.LegPrefill {
		return e.generatePrefill(ctx, req)
	}
	s, err := e.core.newSeq(req, req.Tokens, nil, Prompt{}, e.clk.Now()) // reads only the immutable config
	if err != nil {
		return nil, err
	}
	st := &stream{notify: make(chan struct{}, 1)}
	s.Tag = st
	out := make(chan engine.Chunk, 4)
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, engine.ErrClosed
	}
	e.wg.Add(1)
	e.mu.Unlock()
	go e.pump(ctx, s, st, out)
	return out, nil
}

func trySend(out chan<- engine.Chunk, c engine.Chunk) {
	select {
	case out <- c:
	default:
	}
}

func (e *Engine) abort(s *Seq) {
	e.mu.Lock()
	e.core.Abort(s, e.clk.Now())
	e.mu.Unlock()
	e.poke()
}

// pump fetches the request's missing prefix (when a Fetcher is set), queues
// it, and forwards its output until it finishes, is cancelled, or the
// engine closes.
func (e *Engine) pump(ctx context.Context, s *Seq, st *stream, out chan engine.Chunk) {
	defer e.wg.Done()
	defer close(out)
	f, fetched := e.fetcherFor(s.req)
	if f != nil {
		e.mu.Lock()
		m := e.core.missing(s)
		e.mu.Unlock()
		if len(m.Seq) > 0 {
			// The fetch ends with the request or with the engine.
			fctx, cancel := context.WithCancel(ctx)
			stop := context.AfterFunc(e.ctx, cancel)
			n, err := fetchInto(fctx, f, s.req, m, e)
			stop()
			cancel()
			e.mu.Lock()
			e.core.noteFetch(s, n, err)
			e.mu.Unlock()
		}
	}
	if fetched != nil {
		fetched()
	}
	e.mu.Lock()
	switch {
	case e.closed:
		e.mu.Unlock()
		trySend(out, engine.Chunk{Finish: kv.FinishError, Err: engine.ErrClosed})
		return
	case ctx.Err() != nil:
		e.mu.Unlock()
		trySend(out, engine.Chunk{Finish: kv.FinishCancelled})
		return
	}
	e.core.enqueue(s)
	e.mu.Unlock()
	e.poke()

	for {
		select {
		case <-st.notify:
			toks, fin, u := st.take()
			if len(toks) == 0 && fin == kv.FinishNone {
				continue
			}
			c := engine.Chunk{Tokens: toks, Finish: fin}
			if fin != kv.FinishNone {
				c.Usage = &u
			}
			select {
			case out <- c:
			case <-ctx.Done():
				e.abort(s)
				return
			case <-e.ctx.Done():
				return
			}
			if fin != kv.FinishNone {
				return
			}
		case <-ctx.Done():
			e.abort(s)
			trySend(out, engine.Chunk{Finish: kv.FinishCancelled})
			return
		case <-e.ctx.Done():
			trySend(out, engine.Chunk{Finish: kv.FinishError, Err: engine.ErrClosed})
			return
		}
	}
}

type delivery struct {
	st    *stream
	tok   kv.Token
	fin   kv.FinishReason
	usage engine.Usage
}

// loop steps the core while it has work. A pass's tokens are delivered after
// its modelled time has elapsed on the clock.
func (e *Engine) loop() {
	defer e.wg.Done()
	var pending []delivery
	for {
		e.mu.Lock()
		if e.core.Idle() {
			ready := e.core.TierReady()
			e.mu.Unlock()
			select {
			case <-e.wake:
				continue
			case <-ready:
				e.mu.Lock()
				e.core.SettleTiers()
				e.mu.Unlock()
				continue
			case <-e.ctx.Done():
				return
			}
		}
		r := e.core.Step(e.clk.Now())
		pending = pending[:0]
		for _, o := range r.Outputs {
			d := delivery{st: o.Seq.Tag.(*stream), tok: o.Token, fin: o.Finish}
			if o.Finish != kv.FinishNone {
				d.usage = o.Seq.Usage()
			}
			pending = append(pending, d)
		}
		seqs, preempted, dur, loading := r.Seqs, r.Preempted, r.Duration, r.Loading
		e.mu.Unlock()

		if seqs == 0 && loading > 0 {
			// Only onboarding in flight (timed already scaled by the
			// speedup): step again when it lands or a request arrives.
			if dur > 0 {
				t := e.clk.NewTimer(dur)
				select {
				case <-t.C():
				case <-e.wake:
					t.Stop()
				case <-e.ctx.Done():
					t.Stop()
					return
				}
			}
			continue
		}
		if seqs == 0 && preempted == 0 {
			// Nothing fits (blocks pinned by readers): wait for a change.
			select {
			case <-e.wake:
				continue
			case <-e.ctx.Done():
				return
			}
		}
		if e.cfg.SpeedupRatio > 0 {
			wait := time.Duration(float64(dur) / e.cfg.SpeedupRatio)
			if clock.Sleep(e.ctx, e.clk, wait) != nil {
				return
			}
		}
		for _, d := range pending {
			d.st.push(d.tok, d.fin, d.usage)
		}
		clear(pending)
	}
}
