// Package stages times the steps of one request's path through kvmesh
// (read the body, parse, template, tokenize, hash, route, dispatch, the
// worker's admission, the adapter's request, the engine's first token, the
// first write to the client) into one Prometheus histogram,
// kvmesh_request_stage_seconds{stage}. It costs a clock read and a
// histogram observation per stage, so it is always on; spans (tracing) are
// the per-request view, this the aggregate one that `bench load` reads.
//
// A request carries a *Clock in its context: each layer marks the end of
// its stage, and the time since the previous mark is that stage's. A stage
// is observed once per request (the first attempt's; a migration or a
// retried leg only moves the clock on), so the breakdown adds up to the
// first token of an unmigrated request. The frontend's clock and a
// worker's are separate (the worker may be another process); both observe
// into the same family, and under `kvmesh serve` into the same registry.
package stages

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Stage is one step of the request path.
type Stage uint8

const (
	// Frontend (a request's clock starts when its handler does).
	ReadBody Stage = iota // the request body read
	Parse                 // JSON parsed, model resolved
	Template              // the chat template rendered (chat only)
	Tokenize              // the prompt tokenized, including the wait for a tokenizer slot
	// Fleet.
	Hash     // the prompt's blocks hashed (the router's own timing)
	Route    // the index matched and a worker chosen, less Hash
	Dispatch // the worker's stream opened
	// Frontend again.
	FirstToken // from dispatch to the first token back from the worker
	FirstWrite // the first token detokenized, written and flushed to the client
	// Worker (its own clock starts when its Generate handler does).
	WorkerAdmit   // the request checked and admitted, up to the engine call
	AdapterBuild  // a real engine's adapter built and encoded its HTTP request
	EngineConnect // the request sent and the engine's response headers back
	EngineFirst   // from the engine call (or its headers) to its first output
	numStages
)

var names = [numStages]string{
	"read_body", "parse", "template", "tokenize", "hash", "route", "dispatch", "first_token", "first_write",
	"worker_admit", "adapter_build", "engine_connect", "engine_first_output",
}

func (s Stage) String() string {
	if s < numStages {
		return names[s]
	}
	return "unknown"
}

// All lists the stages in path order.
func All() []Stage {
	out := make([]Stage, numStages)
	for i := range out {
		out[i] = Stage(i)
	}
	return out
}

// Metric is the histogram family's name.
const Metric = "kvmesh_request_stage_seconds"

// Buckets: 5 µs to about 7 s by factors of 1.5, so a quantile read from
// them is within ±25% where most stages sit (µs to ms).
var Buckets = prometheus.ExponentialBuckets(5e-6, 1.5, 36)

// Recorder observes stage durations; a nil Recorder observes nothing.
type Recorder struct {
	obs [numStages]prometheus.Observer
}

// New registers the stage histogram with reg (nil: a private one). A
// frontend and the workers of `serve` share a registry: the second
// registration reuses the first's histogram.
func New(reg prometheus.Registerer) (*Recorder, error) {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: Metric, Help: "Time spent in each stage of a request's path to its first token (first attempt).", Buckets: Buckets,
	}, []string{"stage"})
	if reg != nil {
		if err := reg.Register(h); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, err
			}
			existing, ok := are.ExistingCollector.(*prometheus.HistogramVec)
			if !ok {
				return nil, err
			}
			h = existing
		}
	}
	r := &Recorder{}
	for i := range r.obs {
		r.obs[i] = h.WithLabelValues(names[i]) // resolved once: a label lookup costs more than the observation
	}
	return r, nil
}

// Start begins a request's clock at now.
func (r *Recorder) Start() *Clock { return r.StartAt(time.Now()) }

// StartAt begins a request's clock at t.
func (r *Recorder) StartAt(t time.Time) *Clock {
	if r == nil {
		return nil
	}
	return &Clock{r: r, last: t}
}

// Clock is one request's timeline; a nil Clock does nothing, so code on
// the path marks unconditionally. It is used by one goroutine at a time.
type Clock struct {
	r    *Recorder
	last time.Time
	done uint32 // stages observed already (bit per Stage)
}

// Mark ends stage s now: it observes the time since the previous mark
// (unless s was observed already) and returns it.
func (c *Clock) Mark(s Stage) time.Duration {
	if c == nil {
		return 0
	}
	now := time.Now()
	d := now.Sub(c.last)
	c.last = now
	c.observe(s, d)
	return d
}

// MarkSplit ends stage s now, of which part took partDur (measured by the
// callee): part gets partDur, s the rest.
func (c *Clock) MarkSplit(part Stage, partDur time.Duration, s Stage) {
	if c == nil {
		return
	}
	now := time.Now()
	d := now.Sub(c.last)
	c.last = now
	partDur = min(max(partDur, 0), d)
	c.observe(part, partDur)
	c.observe(s, d-partDur)
}

func (c *Clock) observe(s Stage, d time.Duration) {
	if bit := uint32(1) << s; c.done&bit == 0 {
		c.done |= bit
		c.r.obs[s].Observe(d.Seconds())
	}
}

type ctxKey struct{}

// With returns ctx carrying c.
func With(ctx context.Context, c *Clock) context.Context {
	if c == nil {
		return ctx
	}
	return context.WithValue(ctx, ctxKey{}, c)
}

// From is the clock ctx carries (nil: none).
func From(ctx context.Context) *Clock {
	c, _ := ctx.Value(ctxKey{}).(*Clock)
	return c
}
