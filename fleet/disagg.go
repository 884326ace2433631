package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/internal/stages"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
)

// Disaggregated prefill/decode, prefill first (research kvbm_disagg.md §3,
// Dynamo's PrefillRouter). The rules are the router's leg planner
// (router.LegPlan, which the twin drives too); this file runs the legs it
// asks for. When a model has prefill and decode workers, a request is first
// checked by conditional disaggregation (router.PlanDisagg: it may prefill
// locally on the decode worker); otherwise it gets a prefill
// leg, KV-routed over the prefill pool with the router's hint, whose engine
// samples one token and answers with its connector parameters; then a decode
// leg, routed over the decode pool by load alone, carrying those parameters
// whole as kv_transfer_params and never a hint. The decode leg's stream is
// the client's: its engine pulls the prompt's KV (or recomputes it) and
// generates from the first token on, so the prefill's token only tells
// whether the answer already ended (a stop token, or one token wanted).
//
// An engine that pairs its legs up front (SGLang: the same request goes to
// a prefill and a decode server at once, matched by a bootstrap room)
// answers the prefill leg with its transfer parameters on a chunk before
// the last: the decode leg starts then, and the prefill leg stays open
// until its engine has handed the KV over. If it fails before the decode
// leg's first token, the decode leg is stopped and the request fails as
// the prefill did (a lost worker migrates); after that its end is only
// logged.
//
// Failures: a prefill worker lost before answering is inhibited and the leg
// retried on another (prefill legs are retried, never migrated mid-flight),
// up to router.MaxPrefillTries; then, or with none left, the decode worker
// prefills locally. A decode leg lost
// mid-stream is a lost worker like any (kv.ErrWorkerLost): the frontend
// migrates the request, which plans again. A prefill worker lost after
// answering costs the decode leg its pull: it recomputes.

type disaggMetrics struct {
	paths   *prometheus.CounterVec
	handoff prometheus.Histogram
	retries prometheus.Counter
}

func newDisaggMetrics() *disaggMetrics {
	m := &disaggMetrics{
		paths: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_fleet_requests_by_path_total",
			Help: "Requests (attempts) by serving path: aggregated, disagg, or local_prefill with its reason (isl, prefill_busy, prefill_failed)."},
			[]string{"path", "reason"}),
		handoff: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvmesh_fleet_disagg_handoff_seconds",
			Help:    "From the prefill leg's answer to the decode leg's first token: routing the decode leg, the KV pull (or recompute) and the first decode step.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvmesh_fleet_prefill_retries_total",
			Help: "Prefill legs retried on another prefill worker after theirs was lost."}),
	}
	m.paths.WithLabelValues(string(router.PathAggregated), "")
	m.paths.WithLabelValues(string(router.PathDisagg), "")
	for _, r := range []router.LocalReason{router.ReasonISL, router.ReasonPrefillBusy, router.ReasonPrefillFailed} {
		m.paths.WithLabelValues(string(router.PathLocalPrefill), string(r))
	}
	return m
}

func (m *disaggMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.paths, m.handoff, m.retries}
}

func (m *disaggMetrics) path(p router.DisaggPath, reason router.LocalReason) {
	m.paths.WithLabelValues(string(p), string(reason)).Inc()
}

// Warnings names the models served by their aggregated workers while a
// disaggregated pool lacks its other half, and workers routed kv-approx
// for want of KV events.
func (c *Cluster) Warnings() []string {
	out := c.noEventsWarnings()
	for _, m := range c.cfg.Models {
		p := c.router.PoolSizes(m)
		if p.Agg > 0 && !p.Disagg() && (p.Prefill > 0 || p.Decode > 0) {
			q := p
			q.Agg = 0
			out = append(out, q.Unservable(m)+"; the aggregated workers serve it")
		}
	}
	return out
}

// generate drives one attempt's leg plan (router.LegPlan: the router's
// rules choose the legs) and runs the legs it asks for.
func (c *Cluster) generate(ctx context.Context, req *kv.GenerateRequest) (kv.TokenStream, error) {
	base := router.Request{Model: req.Model, Tokens: req.Tokens, LoRA: req.LoRA, Salt: req.CacheSalt, Known: req.Hashes.KnownHashes()}
	plan := router.NewLegPlan(base, c.cfg.Disagg)
	plan.Queue = c.queue != nil
	step := plan.Start(ctx, c.router)
	var ans prefillAnswer
	for {
		switch {
		case step.Do == router.ActFail:
			return nil, stepErr(step)
		case step.Do == router.ActDone:
			// The prefill's one token was the whole answer: no decode leg.
			return &doneStream{chunk: ans.chunk}, nil
		case step.Leg == kv.LegWhole:
			return c.wholeStep(ctx, req, &plan, step)
		case step.Leg == kv.LegDecode:
			return c.decodeStep(ctx, req, &plan, step, ans)
		}
		var err error
		if ans, step, err = c.prefillStep(ctx, req, &plan, step); err != nil {
			return nil, err
		}
	}
}

// stepErr is a failed step's error as the frontend reports it.
func stepErr(s router.Step) error {
	if s.RouterErr {
		return routeErr(s.Err)
	}
	return s.Err
}

// wholeStep routes a whole-request leg (aggregated, or a decode worker
// prefilling locally) and streams it from the chosen worker.
func (c *Cluster) wholeStep(ctx context.Context, req *kv.GenerateRequest, plan *router.LegPlan, step router.Step) (kv.TokenStream, error) {
	d, err := c.routeLeg(ctx, req, step)
	if err != nil {
		if !errors.Is(err, router.ErrDecodeOnly) {
			c.dmet.path(step.Path, step.Reason)
		}
		return nil, stepErr(plan.RouteFailed(err))
	}
	c.dmet.path(step.Path, step.Reason)
	greq := c.protoRequest(req, d)
	greq.KvFetch = api.HintToProto(d.Hint)
	st, err := c.open(ctx, d, greq)
	if err != nil {
		return nil, err // not a nil *workerStream in the interface
	}
	if st.local != nil {
		return polledStream{st}, nil
	}
	return st, nil
}

// routeLeg routes step's leg in its span. With the router queue, a leg
// whose pool admits no one waits there for a worker that does (a prefill
// leg for a prefill worker, a decode leg, its prefill done, for a decode
// worker), as the leg planner expects (LegPlan.Queue).
func (c *Cluster) routeLeg(ctx context.Context, req *kv.GenerateRequest, step router.Step) (*router.Decision, error) {
	rctx, sp := routeSpan(ctx, req, step.Leg, step.Path)
	d, err := c.router.Route(rctx, step.Req)
	if c.queue != nil && errors.Is(err, kv.ErrAllBusy) {
		d, err = c.queue.await(rctx, step.Req)
	}
	endRoute(sp, d, err)
	if err == nil {
		stages.From(ctx).MarkSplit(stages.Hash, d.Timing.Hash, stages.Route)
		// For the prompts that will start with these tokens (the
		// conversation's next turn).
		req.Hashes.Keep(kv.BlockHashes{Seed: kv.Seed(step.Req.LoRA, step.Req.Salt), BlockSize: d.BlockSize, Local: d.Local, Seq: d.Seq})
	}
	return d, err
}

// prefillStep routes and runs a prefill leg and reports its outcome to the
// plan: answered, lost (the plan retries or falls back) or a routing
// failure. err is a failure the plan is not told of (the client left, the
// worker failed other than by being lost).
func (c *Cluster) prefillStep(ctx context.Context, req *kv.GenerateRequest, plan *router.LegPlan, step router.Step) (prefillAnswer, router.Step, error) {
	if step.Retry {
		c.dmet.retries.Inc()
	}
	d, err := c.routeLeg(ctx, req, step)
	if err != nil {
		return prefillAnswer{}, plan.RouteFailed(err), nil
	}
	worker := d.Worker
	greq := c.protoRequest(req, d)
	greq.Leg = api.Leg_LEG_PREFILL
	greq.KvFetch = api.HintToProto(d.Hint) // the hint is applied here, once
	ans, err := c.prefillOn(ctx, d, greq)
	switch {
	case err == nil:
		c.dmet.path(router.PathDisagg, "")
		return ans, plan.Answered(ans.params == nil), nil
	case !errors.Is(err, kv.ErrWorkerLost) || ctx.Err() != nil:
		return prefillAnswer{}, step, err
	}
	c.log.Warn("prefill worker lost before answering; retrying on another", "request", req.RequestID, "worker", worker, "err", err)
	return prefillAnswer{}, plan.Lost(worker, err), nil
}

// decodeStep starts the decode leg after the prefill leg answered with
// its connector parameters.
func (c *Cluster) decodeStep(ctx context.Context, req *kv.GenerateRequest, plan *router.LegPlan, step router.Step, ans prefillAnswer) (kv.TokenStream, error) {
	if err := ctx.Err(); err != nil {
		// The client left between the legs: no decode leg; the prefill
		// worker releases its pinned blocks at the handoff's expiry.
		ans.leg.stop()
		return nil, err
	}
	// The handoff: from the prefill's answer to the decode leg's first
	// token (routing the decode leg, the KV pull, the first step).
	_, hsp := childSpanAt(ctx, "disagg.handoff", trace.SpanKindInternal, ans.at)
	if hsp.IsRecording() {
		hsp.SetAttributes(attribute.Int("kvmesh.handoff.params_bytes", len(ans.params)))
	}
	d, err := c.routeLeg(ctx, req, step)
	if err != nil {
		endSpan(hsp, err)
		ans.leg.stop()
		return nil, stepErr(plan.RouteFailed(err))
	}
	greq := c.protoRequest(req, d)
	greq.Leg = api.Leg_LEG_DECODE
	greq.KvTransferParams = ans.params // whole: never merged, never a hint
	dctx, dcancel := context.WithCancel(ctx)
	st, err := c.open(dctx, d, greq)
	if err != nil {
		endSpan(hsp, err)
		dcancel()
		ans.leg.stop()
		return nil, err
	}
	ds := &decodeStream{workerStream: st, cached: ans.chunk.CachedTokens, cachedBy: ans.chunk.CachedByTier, answered: ans.at, met: c.dmet, handoff: hsp, cancel: dcancel}
	if ans.leg != nil {
		ds.prefill = ans.leg
		ans.leg.follow(c, req.RequestID, dcancel)
	}
	return ds, nil
}

// prefillAnswer is a prefill leg's outcome.
type prefillAnswer struct {
	chunk  kv.TokenChunk // its token, finish reason and usage
	params []byte        // connector parameters; nil when the answer is final
	at     time.Time
	// leg is the prefill leg still running when its engine gave the
	// parameters before its last chunk; nil otherwise.
	leg *openPrefill
}

// prefillOn sends the prefill leg to d's worker and reads its answer.
func (c *Cluster) prefillOn(ctx context.Context, d *router.Decision, greq *api.GenerateRequest) (prefillAnswer, error) {
	// The leg's own context: stopping a leg that answered early is not
	// the caller's cancellation, nor its worker's failure.
	lctx, lcancel := context.WithCancel(ctx)
	st, err := c.open(lctx, d, greq)
	if err != nil {
		lcancel()
		return prefillAnswer{}, err
	}
	var ans prefillAnswer
	defer func() {
		if ans.leg == nil {
			st.Close()
			lcancel()
		}
	}()
	for {
		ch, err := st.Recv()
		if err != nil {
			if err == io.EOF {
				err = fmt.Errorf("prefill worker %v ended without an answer: %w", d.Worker, kv.ErrWorkerLost)
			}
			return prefillAnswer{}, err
		}
		ans.chunk.Tokens = append(ans.chunk.Tokens, ch.Tokens...)
		if ch.Finish == kv.FinishNone {
			if p := st.params(); len(p) > 0 {
				// Parameters up front: the decode leg starts now, this one
				// runs on until its engine has handed the KV over.
				ans.params, ans.at = slices.Clone(p), time.Now()
				ans.leg = &openPrefill{st: st, cancel: lcancel, worker: d.Worker, done: make(chan struct{})}
				return ans, nil
			}
			continue
		}
		ans.chunk.Finish, ans.chunk.PromptTokens, ans.chunk.CachedTokens = ch.Finish, ch.PromptTokens, ch.CachedTokens
		ans.chunk.CachedByTier = ch.CachedByTier
		if p := st.params(); len(p) > 0 {
			ans.params = slices.Clone(p) // the codec reuses the message
		}
		ans.at = time.Now()
		return ans, nil
	}
}

// doneStream is a prefill answer that was final.
type doneStream struct {
	chunk kv.TokenChunk
	sent  bool
}

func (s *doneStream) Recv() (kv.TokenChunk, error) {
	if s.sent {
		return kv.TokenChunk{}, io.EOF
	}
	s.sent = true
	return s.chunk, nil
}

func (s *doneStream) Close() error { return nil }

// openPrefill is a prefill leg that answered before its last chunk,
// followed while the decode leg runs.
type openPrefill struct {
	st       *workerStream
	cancel   context.CancelFunc
	worker   kv.WorkerKey
	done     chan struct{} // closed when the leg has ended (err, cached set)
	err      error         // its failure, nil when it finished
	cached   int
	cachedBy kv.CachedByTier
	started  atomic.Bool // the decode leg has produced a token
	followed bool
}

// follow reads the leg to its end. A failure before the decode leg's
// first token stops the decode leg (stopDecode): without the prefill's KV
// it cannot go on.
func (p *openPrefill) follow(c *Cluster, reqID string, stopDecode context.CancelFunc) {
	p.followed = true
	go func() {
		defer close(p.done)
		for {
			ch, err := p.st.Recv()
			if err != nil {
				if p.st.ctx.Err() != nil {
					return // stopped by us or the caller
				}
				p.err = err
				if !p.started.Load() {
					c.log.Warn("prefill leg failed before the decode leg's first token; stopping it", "request", reqID, "worker", p.worker, "err", err)
					stopDecode()
				} else {
					c.log.Debug("prefill leg ended with an error after the decode leg started", "request", reqID, "worker", p.worker, "err", err)
				}
				return
			}
			if ch.Finish != kv.FinishNone {
				p.cached, p.cachedBy = ch.CachedTokens, ch.CachedByTier
				return
			}
		}
	}()
}

// stop ends the leg (nil-safe), waiting for its reader if it has one.
func (p *openPrefill) stop() {
	if p == nil {
		return
	}
	p.cancel()
	if p.followed {
		<-p.done
	}
	p.st.Close()
}

// decodeStream is the decode leg's stream. Its usage reports the prefill
// leg's cache hits as cached_tokens: the blocks the decode pulled were
// computed for this request, not found in a cache.
type decodeStream struct {
	*workerStream
	cached   int
	cachedBy kv.CachedByTier
	answered time.Time
	first    bool
	met      *disaggMetrics
	handoff  trace.Span // ends at the first token (or with the stream)
	cancel   context.CancelFunc
	prefill  *openPrefill // a prefill leg still open; nil when it answered at its end
}

func (s *decodeStream) Recv() (kv.TokenChunk, error) {
	ch, err := s.workerStream.Recv()
	if err != nil {
		if p := s.prefill; p != nil && !s.first && s.workerStream.ctx.Err() != nil {
			// Stopped: by the prefill leg's failure, or the caller (then
			// the prefill leg ends at once too).
			<-p.done
			if p.err != nil && s.workerStream.ctx.Err() != nil {
				err = fmt.Errorf("prefill leg: %w", p.err)
			}
		}
		if !s.first {
			s.first = true
			endSpan(s.handoff, err)
		}
		return ch, err
	}
	if !s.first && len(ch.Tokens) > 0 {
		s.first = true
		if s.prefill != nil {
			s.prefill.started.Store(true)
		}
		s.met.handoff.Observe(time.Since(s.answered).Seconds())
		endSpan(s.handoff, nil)
	}
	if ch.Finish != kv.FinishNone {
		ch.CachedTokens, ch.CachedByTier = s.cached, s.cachedBy
		if p := s.prefill; p != nil {
			// The prefill's own count when it has answered (it usually has:
			// it answers once the KV is handed over); else the decode's.
			select {
			case <-p.done:
				if p.err == nil {
					ch.CachedTokens, ch.CachedByTier = p.cached, p.cachedBy
				}
			default:
			}
		}
	}
	return ch, nil
}

// Close ends the stream, the prefill leg if still open, and, if no token
// came, the handoff span.
func (s *decodeStream) Close() error {
	if !s.first {
		s.first = true
		endSpan(s.handoff, nil)
	}
	err := s.workerStream.Close()
	s.cancel()
	s.prefill.stop()
	return err
}
