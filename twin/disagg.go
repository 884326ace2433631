package twin

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
)

// Disaggregated prefill/decode in virtual time. With Config.PrefillWorkers
// and DecodeWorkers set, the fleet is a prefill pool and a decode pool of
// sim cores (after any aggregated ones: instances 1..A aggregated, then P
// prefill, then D decode) and every request takes the prefill-first path
// the fleet takes online, as the router's leg planner (router.LegPlan, the
// fleet's too) says:
//
//   - conditional disaggregation: when the prompt's net new part (prompt −
//     what the best decode worker already holds) is short in tokens and as
//     a fraction of the prompt, or every prefill worker is busy, the request
//     runs whole on a decode worker (local_prefill, with the reason);
//   - otherwise a prefill leg (max_tokens 1) is routed over the prefill pool
//     by overlap and load, carrying the router's hint in kv+hints mode;
//   - when it ends, its prompt blocks stay pinned on the prefill core and a
//     decode leg is routed over the decode pool by load alone; the decode
//     core pulls the blocks it lacks from the prefill core (payload bytes
//     checksummed and verified by Insert, as a hinted peer fetch does) and
//     decodes; what it cannot pull it recomputes.
//
// The handoff does not stall the decode core's passes (a NIXL-style pull
// runs beside the forward passes): the decode leg reaches the decode core
// when its modelled transfer ends, pulled blocks × the modelled block size
// at Config.TransferBandwidth after the prefill's last token. The decode
// core then computes the prompt's partial last block (at least its last
// token, as a vLLM decode worker does) and samples the client's first token.
// A prefill leg whose token ends the request (max_tokens 1, or EOS) is the
// whole answer: no decode leg.

// PathStats counts the requests of a P/D run by path (a fleet without
// P/D serves every request aggregated) and measures the handoffs.
type PathStats struct {
	// Aggregated: a mixed fleet's requests sent whole to its aggregated
	// pool (router.PreferAggregated).
	Aggregated   int `json:"aggregated"`
	Disagg       int `json:"disagg"`
	LocalPrefill int `json:"local_prefill"`
	// LocalISL and LocalPrefillBusy split LocalPrefill by reason
	// (router.ReasonISL, router.ReasonPrefillBusy).
	LocalISL         int `json:"local_isl"`
	LocalPrefillBusy int `json:"local_prefill_busy"`
	// PrefillOnly are disagg requests whose prefill token ended them.
	PrefillOnly int `json:"prefill_only"`

	Handoffs      int     `json:"handoffs"`       // decode legs that pulled from a prefill worker
	HandoffBlocks int64   `json:"handoff_blocks"` // blocks pulled
	HandoffBytes  int64   `json:"handoff_bytes"`  // HandoffBlocks × modelled block size
	PayloadBytes  int64   `json:"payload_bytes"`  // sim payload bytes copied and verified
	HandoffP50MS  float64 `json:"handoff_p50_ms"` // modelled transfer time
	HandoffP99MS  float64 `json:"handoff_p99_ms"` //
	HeldBlocks    int64   `json:"held_blocks"`    // prompt blocks the decode worker already held
	PullFailures  int     `json:"pull_failures"`  // pulls that errored or inserted fewer blocks than asked
	// Recomputes are decode legs that computed some of the prompt's full
	// blocks themselves (a short pull, or pulled blocks evicted before the
	// leg was scheduled); RecomputedToks are those tokens.
	Recomputes     int   `json:"recomputes"`
	RecomputedToks int64 `json:"recomputed_tokens"`
	PinnedPeak     int64 `json:"pinned_peak"` // most prefill blocks pinned for handoffs at once
}

// pdReq is a disaggregated request's state between its legs.
type pdReq struct {
	st      *request
	plan    router.LegPlan
	pre     *router.Decision
	preSeq  *sim.Seq
	preW    int
	plen    int
	prompt  sim.Prompt
	seq     []kv.SeqHash // the prompt's full-block sequence hashes
	release func()       // unpins the prompt's blocks on the prefill core
	pinned  int
	dstW    int
	step    router.Step // the decode leg's step
	at      int64       // when the decode leg reaches its core
	n       uint64
	// busyAt is pdState.epoch+1 when the router last said every decode
	// worker is busy for this leg (0: not asked yet): until the decode
	// pool changes, asking again gets the same answer.
	busyAt uint64
}

// pdState is the run's P/D machinery; nil without P/D.
type pdState struct {
	agg, pre, dec int // pool sizes; ws is [agg | pre | dec]
	pending       handoffHeap
	waitDecode    []*pdReq // decode legs waiting in the router queue
	n             uint64
	cur           *pdReq // the handoff being added (read by the decode Fetcher)
	pinned        int64
	xferMS        []float64
	policy        router.DisaggConfig
	// epoch counts the changes of the decode pool a waiting decode leg may
	// wait for: a decode worker's passes that freed something, its load
	// reports, and the requests booked on it.
	epoch uint64
}

// changed notes a change of worker w's state (a pass that freed
// something, a load report) for the requests waiting for it.
func (t *twin) changed(w int) {
	t.ws[w].ver++
	t.touch(w)
	if t.pd != nil && t.pd.role(w) == kv.RoleDecode {
		t.pd.epoch++
	}
}

// booked notes a request routed by d (P/D): one booked on a decode worker
// changes what the waiting decode legs may be told.
func (t *twin) booked(d *router.Decision) {
	w := int(d.Worker.Instance) - 1
	if w < 0 || w >= len(t.ws) {
		return
	}
	t.touch(w)
	if t.pd.role(w) == kv.RoleDecode {
		t.pd.epoch++
	}
}

type handoffHeap []*pdReq

func (h handoffHeap) Len() int { return len(h) }
func (h handoffHeap) Less(i, j int) bool {
	return h[i].at < h[j].at || (h[i].at == h[j].at && h[i].n < h[j].n)
}
func (h handoffHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *handoffHeap) Push(x any)   { *h = append(*h, x.(*pdReq)) }
func (h *handoffHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return x
}

// nextHandoff is when the earliest pending decode leg reaches its core.
func (p *pdState) nextHandoff() (int64, bool) {
	if len(p.pending) == 0 {
		return 0, false
	}
	return p.pending[0].at, true
}

// newPD sets up the P/D state when cfg asks for it.
func newPD(cfg Config) *pdState {
	if cfg.PrefillWorkers == 0 && cfg.DecodeWorkers == 0 {
		return nil
	}
	return &pdState{agg: cfg.Workers, pre: cfg.PrefillWorkers, dec: cfg.DecodeWorkers,
		policy: router.DisaggConfig{LocalPrefillTokens: cfg.LocalPrefillTokens, LocalPrefillRatio: cfg.LocalPrefillRatio}}
}

// role is worker i's role.
func (p *pdState) role(i int) kv.Role {
	switch {
	case i < p.agg:
		return kv.RoleAggregated
	case i < p.agg+p.pre:
		return kv.RolePrefill
	}
	return kv.RoleDecode
}

// setupCore shapes worker i's sim and router entry for its role: P/D cores
// keep payload bytes (handoffs read and verify them) and decode cores pull
// handoffs through their Fetcher (hints too, on a local prefill).
func (t *twin) setupCore(i int, sc *sim.Config, info *router.WorkerInfo, hints bool) {
	p := t.pd
	role := p.role(i)
	sc.Role, info.Role = role, role
	if role == kv.RoleAggregated {
		return
	}
	sc.Layers = sim.DefaultLayers
	if role == kv.RoleDecode {
		sc.Fetcher = t.decodeFetch
		// The handoff's time is modelled before the leg reaches the core.
		sc.TransferBandwidth = -1
		if hints {
			// A hinted local prefill's fetch has no separate modelled
			// transfer: price it in-pass as aggregated workers do.
			sc.TransferBandwidth = t.cfg.TransferBandwidth
		}
	}
}

// arrivePD serves trace request i (prompt plen tokens, routed as rr) the
// way the shared leg planner (router.LegPlan) says, as the fleet does.
// With the router queue a leg no worker admits waits there (routePD), and
// a request arriving while others wait queues behind them.
func (t *twin) arrivePD(ctx context.Context, i int, atNS int64, plen int, rr router.Request, tail []kv.Token) error {
	rq := &t.wl.Requests[i]
	st := &t.reqs[i]
	st.arrival = t.at(atNS)
	st.er = engine.Request{ID: strconv.Itoa(rq.Line), Sampling: kv.Sampling{MaxTokens: max(rq.OutputLength, 1), Seed: rng64(t.cfg.Seed, i)}}
	if t.q != nil && rr.Local != nil {
		// A queued request's legs are routed again and again: chain its
		// hashes once.
		rr.Seq = kv.SeqHashes(make([]kv.SeqHash, 0, len(rr.Local)), rr.Local)
	}
	plan := router.NewLegPlan(rr, t.pd.policy)
	plan.Queue = t.q != nil
	q := queued{i: i, plen: plen, rr: rr, arrNS: atNS, plan: &plan, prompt: sim.Prompt{Len: plen, Local: rr.Local, Tail: tail}}
	if t.q != nil && t.q.Len() > 0 {
		t.push(q)
		return t.dispatch(ctx, atNS)
	}
	err := t.routePD(ctx, &q, atNS)
	if t.q != nil && errors.Is(err, kv.ErrAllBusy) {
		t.push(q)
		return nil
	}
	if err != nil {
		return t.routeFailed(err, atNS, rq.Line)
	}
	return nil
}

// routePD drives q's leg plan from its step (starting the plan first if
// it has not) until a leg starts (nil) or the plan fails (its error). With
// the router queue, a leg whose pool admits no one returns the router's
// busy answer and q.step stays that leg, to be routed again.
func (t *twin) routePD(ctx context.Context, q *queued, nowNS int64) error {
	if q.step.Do == 0 {
		q.step = q.plan.Start(ctx, t.r)
	}
	for q.step.Do == router.ActRoute {
		q.step.Req.Aged = q.rr.Aged
		d, err := t.r.Route(ctx, q.step.Req)
		if err != nil {
			if t.q != nil && errors.Is(err, kv.ErrAllBusy) {
				return err
			}
			q.step = q.plan.RouteFailed(err)
			continue
		}
		t.booked(d)
		st := &t.reqs[q.i]
		if q.step.Leg == kv.LegPrefill {
			t.startPrefill(*q.plan, d, st, q.prompt, nowNS)
		} else {
			t.startWhole(q.step, d, st, q.prompt, nowNS)
		}
		if t.q != nil {
			t.qwait = append(t.qwait, ms(time.Duration(nowNS-q.arrNS)))
		}
		return nil
	}
	return q.step.Err
}

// startWhole adds a request served in one leg (aggregated, or prefilled
// locally on a decode worker) and counts its path.
func (t *twin) startWhole(step router.Step, d *router.Decision, st *request, prompt sim.Prompt, atNS int64) {
	if err := t.addLeg(d, st, &st.er, prompt, atNS); err != nil {
		return
	}
	t.predicted += int64(d.CachedTokens)
	t.reachable += int64(d.ReachableTokens)
	ps := t.res.Paths
	switch {
	case step.Path == router.PathAggregated:
		ps.Aggregated++
	case step.Reason == router.ReasonPrefillBusy:
		ps.LocalPrefill++
		ps.LocalPrefillBusy++
	default:
		ps.LocalPrefill++
		ps.LocalISL++
	}
}

// startPrefill adds a disaggregated request's prefill leg (decision pre);
// its end (prefillDone) asks the plan for the decode leg.
func (t *twin) startPrefill(plan router.LegPlan, pre *router.Decision, st *request, prompt sim.Prompt, atNS int64) {
	p := &pdReq{st: st, plan: plan, pre: pre, plen: prompt.Len, prompt: prompt, seq: pre.Seq}
	p.preW = int(pre.Worker.Instance) - 1
	er := &engine.Request{ID: st.er.ID, Leg: kv.LegPrefill, Sampling: st.er.Sampling}
	er.MaxTokens = 1
	s, err := t.addSeq(pre, er, prompt, atNS, pre.Hint)
	if err != nil {
		return
	}
	p.preSeq = s
	s.Tag = p
	t.predicted += int64(pre.CachedTokens)
	t.reachable += int64(pre.ReachableTokens)
	st.pd = p
	t.res.Paths.Disagg++
}

// routeFailed counts a request the router could not place (all busy: a
// 503) or fails the run.
func (t *twin) routeFailed(err error, atNS int64, line int) error {
	var be *kv.BusyError
	if errors.As(err, &be) {
		t.reject(&t.res.RejectedBusy, atNS+int64(be.RetryAfter), "")
		return nil
	}
	return fmt.Errorf("twin: route trace line %d: %w", line, err)
}

// addSeq adds er to decision d's core at atNS, with hint for its Fetcher
// (which reads it from er); a refusal closes d and counts the rejection.
func (t *twin) addSeq(d *router.Decision, er *engine.Request, p sim.Prompt, atNS int64, hint *kv.Hint) (*sim.Seq, error) {
	w := int(d.Worker.Instance) - 1
	if w < 0 || w >= len(t.ws) {
		d.Done()
		return nil, fmt.Errorf("twin: router chose unknown worker %v", d.Worker)
	}
	er.KVHint = hint
	if hint != nil {
		t.res.Hints.Hints++
		t.res.Hints.PlannedBlocks += int64(len(hint.Hashes) - int(d.Overlap[kv.NumTiers-1]))
	}
	s, err := t.ws[w].core.AddPrompt(er, p, t.at(atNS))
	if err != nil {
		d.Done()
		t.touch(w)
		t.reject(&t.res.RejectedInvalid, atNS, err.Error())
		return nil, err
	}
	t.wake(w, atNS)
	return s, nil
}

// addLeg adds the request's serving leg (local prefill or decode) and ties
// it to st.
func (t *twin) addLeg(d *router.Decision, st *request, er *engine.Request, p sim.Prompt, atNS int64) error {
	s, err := t.addSeq(d, er, p, atNS, d.Hint)
	if err != nil {
		return err
	}
	st.dec, st.seq = d, s
	s.Tag = st
	return nil
}

// prefillDone handles a prefill leg's only token: the request ends there
// (max_tokens 1 or EOS) or its decode leg is routed and its handoff
// scheduled.
func (t *twin) prefillDone(p *pdReq, o *sim.Output, now time.Time, nowNS int64) {
	p.pre.FirstToken()
	p.pre.Done()
	st := p.st
	step := p.plan.Answered(o.Finish == kv.FinishStop || st.er.MaxTokens <= 1)
	if step.Do == router.ActDone {
		st.seq = p.preSeq
		t.res.Paths.PrefillOnly++
		t.complete(st, now, nowNS)
		return
	}
	// Keep the prompt's blocks until the decode side has read them.
	src := t.ws[p.preW].core
	p.pinned, p.release = src.Pin(p.seq)
	t.pd.pinned += int64(p.pinned)
	t.res.Paths.PinnedPeak = max(t.res.Paths.PinnedPeak, t.pd.pinned)

	p.step = step
	if p.step.Req.Local != nil {
		p.step.Req.Seq = p.seq // hashed once, for every time the leg is routed
	}
	t.syncClock()
	d, err := t.r.Route(context.Background(), step.Req)
	if err != nil && t.q != nil && errors.Is(err, kv.ErrAllBusy) {
		// The router queue holds the decode leg (its blocks stay pinned)
		// until a decode worker admits it.
		t.pd.waitDecode = append(t.pd.waitDecode, p)
		p.busyAt = t.pd.epoch + 1
		t.res.Queue.DecodeQueued++
		return
	}
	if err != nil {
		t.decodeFailed(p, err, nowNS)
		return
	}
	t.handoff(p, d, nowNS)
}

// decodeFailed gives up a disaggregated request whose decode leg could
// not be routed (err): a 503 when every decode worker is busy.
func (t *twin) decodeFailed(p *pdReq, err error, nowNS int64) {
	st := p.st
	err = p.plan.RouteFailed(err).Err
	t.unpin(p)
	st.pd, st.seq = nil, nil
	var be *kv.BusyError
	if errors.As(err, &be) {
		t.reject(&t.res.RejectedBusy, nowNS+int64(be.RetryAfter), "")
	} else {
		t.reject(&t.res.RejectedInvalid, nowNS, "decode leg of request "+st.er.ID+": "+err.Error())
	}
}

// handoff schedules p's decode leg, routed by d at nowNS: it reaches its
// core when the modelled pull of the blocks it lacks ends.
func (t *twin) handoff(p *pdReq, d *router.Decision, nowNS int64) {
	t.booked(d)
	st := p.st
	st.dec = d
	p.dstW = int(d.Worker.Instance) - 1
	held := 0
	if p.dstW >= 0 && p.dstW < len(t.ws) {
		held = t.ws[p.dstW].core.Lookup(p.seq)
	}
	pull := max(min(p.pinned, len(p.seq))-held, 0)
	ms := sim.TransferMS(int64(pull)*t.cfg.TransferBytesPerBlock, t.cfg.TransferBandwidth)
	t.pd.xferMS = append(t.pd.xferMS, ms)
	t.res.Paths.HeldBlocks += int64(held)
	p.at = nowNS + int64(msToDur(ms))
	p.n = t.pd.n
	t.pd.n++
	heap.Push(&t.pd.pending, p)
}

// dispatchDecodes routes the decode legs waiting for a decode worker, in
// the order their prefills ended; the busy ones stay, and are not asked
// again until the decode pool changes (pdState.epoch): re-routing every
// waiting leg on every dispatch made the queued replay ~30× slower.
func (t *twin) dispatchDecodes(nowNS int64) {
	w := t.pd.waitDecode
	if len(w) == 0 || !t.r.AdmittingDecodeLeg(model) {
		return // no decode worker admits even a leg with nothing to hold
	}
	k := 0
	for _, p := range w {
		if p.busyAt == t.pd.epoch+1 {
			w[k] = p
			k++
			continue
		}
		d, err := t.r.Route(context.Background(), p.step.Req)
		switch {
		case err != nil && errors.Is(err, kv.ErrAllBusy):
			p.busyAt = t.pd.epoch + 1
			w[k] = p
			k++
		case err != nil:
			t.decodeFailed(p, err, nowNS)
		default:
			t.handoff(p, d, nowNS)
		}
	}
	clear(w[k:])
	t.pd.waitDecode = w[:k]
}

func msToDur(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

func (t *twin) unpin(p *pdReq) {
	if p.release != nil {
		p.release()
		p.release = nil
		t.pd.pinned -= int64(p.pinned)
	}
}

// handoffEvent delivers the earliest pending decode leg to its core: the
// core's Fetcher pulls the blocks it lacks from the prefill core, then the
// prompt's blocks are unpinned there.
func (t *twin) handoffEvent() error {
	p := heap.Pop(&t.pd.pending).(*pdReq)
	t.advance(p.at)
	st := p.st
	d := st.dec
	er := &engine.Request{ID: st.er.ID, Leg: kv.LegDecode, Sampling: st.er.Sampling}
	t.pd.cur = p
	// The pull's time is modelled already (handoff): with hints the decode
	// core prices fetches in-pass, which must not charge this one again.
	prompt := p.prompt
	prompt.Prepaid = true
	s, err := t.addSeq(d, er, prompt, p.at, nil)
	t.pd.cur = nil
	t.unpin(p)
	if err != nil {
		st.pd = nil
		return nil
	}
	st.seq = s
	s.Tag = st
	t.res.Paths.Handoffs++
	return nil
}

// decodeFetch is every decode core's Fetcher: a handoff's pull, or a
// hinted local prefill's peer fetch.
func (t *twin) decodeFetch(ctx context.Context, req *engine.Request, m sim.Missing, into sim.Inserter) error {
	p := t.pd.cur
	if p == nil {
		return t.fetch(ctx, req, m, into)
	}
	ps := t.res.Paths
	end := min(p.pinned, m.Start+len(m.Seq))
	if end <= m.Start {
		return nil
	}
	n, payload, err := t.copier.copy(t.ws[p.preW].core, p.preW, m, end-m.Start, into)
	ps.HandoffBlocks += int64(n)
	ps.HandoffBytes += int64(n) * t.cfg.TransferBytesPerBlock
	ps.PayloadBytes += int64(payload)
	if err != nil || n < end-m.Start {
		ps.PullFailures++
	}
	return err
}

// finishPD completes the P/D figures.
func (t *twin) finishPD() {
	ps := t.res.Paths
	if ps == nil {
		return
	}
	d := newDist(t.pd.xferMS)
	ps.HandoffP50MS, ps.HandoffP99MS = d.P50, d.P99
}

// decodeDone accounts a finished decode leg (m: its metrics): the prompt's
// full-block tokens it did not find cached when first scheduled were
// recomputed.
func (t *twin) decodeDone(p *pdReq, m sim.Metrics) {
	// The sim computes at least the prompt's last token, so at most the
	// full blocks before it can be cached.
	full := (p.plen - 1) / t.cfg.BlockSize * t.cfg.BlockSize
	if miss := full - m.CachedTokens; miss > 0 {
		t.res.Paths.Recomputes++
		t.res.Paths.RecomputedToks += int64(miss)
	}
}
