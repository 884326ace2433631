// Package twin is kvmesh's offline digital twin: it replays a request trace
// against a fleet of simulated engines (engine/sim Cores) in virtual time,
// routing every request with the real router (package router) exactly as
// the frontend would, and measures what each routing mode costs or saves.
//
// Nothing is forked: the twin drives sim.Core and router.Router as they
// are. In kv modes the router's index (package index) is fed by the cores'
// own KV events, in order; in kv+hints mode a hinted request's target core
// copies the hinted blocks from the source core (Pin + ReadPayload →
// Insert, payload bytes verified) through the sim's Fetcher hook, and the
// sim charges the modelled transfer time to the pass that first schedules
// the request. With prefill and decode pools (Config.PrefillWorkers,
// DecodeWorkers) every request takes the router's disaggregation policy's
// path, the legs on their pools' cores and the KV handoff between them in
// virtual time (disagg.go).
//
// The loop is a discrete-event simulation on one goroutine: the events are
// arrivals (trace timestamps, or a closed loop of C clients) and each
// core's pass ends. At a pass end the twin hands the pass's outputs to the
// router (Decision.FirstToken / Done) at that virtual time, reports the
// worker's load (UpdateLoad) periodically, and starts the next pass.
//
// It imports router, index, engine/sim, clock, kv, trace and plot, and must
// not import the live fleet, worker, NATS or gRPC: the twin is the same cores
// without the transports.
package twin

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/clock"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/trace"
)

// ModeKVHints is the one twin mode beyond the router's own (router.Modes):
// kv routing with KV hints.
const ModeKVHints = "kv+hints"

// Modes lists every twin mode in comparison order: the router's, then
// kv+hints.
var Modes = func() []string {
	var ms []string
	for _, m := range router.Modes {
		ms = append(ms, string(m))
	}
	return append(ms, ModeKVHints)
}()

// ParseMode parses a twin mode name (case-insensitive) into its canonical
// name, the router mode it runs and whether hints are on.
func ParseMode(s string) (name string, mode router.Mode, hints bool, err error) {
	if strings.EqualFold(strings.TrimSpace(s), ModeKVHints) {
		return ModeKVHints, router.ModeKV, true, nil
	}
	if mode, err = router.ParseMode(s); err != nil {
		return "", "", false, fmt.Errorf("unknown twin mode %q (want %s)", s, strings.Join(Modes, ", "))
	}
	return string(mode), mode, false, nil
}

// Defaults. The modelled KV block is a Llama-3-8B-like layout: 32 layers ×
// 8 KV heads × 128 head dim × (K, V) × 2 bytes = 128 KiB per token, so a
// 64-token block is 8 MiB; peers move it at the mocker's 64 GB/s.
const (
	DefaultWorkers         = 8
	DefaultKVBytesPerToken = 128 << 10
	DefaultLoadInterval    = 100 * time.Millisecond
	// model is the model name every twin worker serves.
	model = "twin"
	// stallLimit bounds consecutive passes that schedule nothing on one
	// core; only a bug (a block pinned forever) can reach it.
	stallLimit = 1 << 20
)

// Config is one simulation run.
type Config struct {
	Mode    string `json:"mode"`
	Workers int    `json:"workers"` // default 8

	// Engine shape (engine/sim defaults when zero: the mocker's).
	BlockSize        int `json:"block_size"`         // tokens per KV block, default 64
	Blocks           int `json:"blocks"`             // KV blocks per worker, default 16384
	MaxBatchedTokens int `json:"max_batched_tokens"` // default 8192
	MaxSeqs          int `json:"max_seqs"`           // default 256

	// Load: open loop replays trace timestamps divided by ArrivalSpeedup
	// (default 1); Concurrency > 0 runs a closed loop of that many clients
	// instead (a new request as soon as one ends).
	ArrivalSpeedup float64 `json:"arrival_speedup"`
	Concurrency    int     `json:"concurrency"`

	// Seed drives the router's random choices and the requests' sampling.
	Seed uint64 `json:"seed"`

	// Peer transfers (kv+hints): bandwidth in bytes/s (default 64e9; < 0
	// makes transfers free) and the modelled size of one KV block (default
	// BlockSize × KVBytesPerToken).
	TransferBandwidth     float64 `json:"transfer_bandwidth"`
	KVBytesPerToken       int64   `json:"kv_bytes_per_token"`
	TransferBytesPerBlock int64   `json:"transfer_bytes_per_block"`

	// LoadInterval is how often (virtual time) a busy worker reports its
	// load to the router, as a load publisher would; default 100 ms.
	LoadInterval time.Duration `json:"load_interval_ns"`

	// Router busy thresholds (0 = off); a request every worker is too busy
	// for is rejected, as the frontend would answer 503.
	MaxKVUsage       float64 `json:"max_kv_usage,omitempty"`
	MaxPrefillTokens int64   `json:"max_prefill_tokens,omitempty"`
	// ApproxTTL is kv-approx's block lifetime (router default 120 s).
	ApproxTTL time.Duration `json:"approx_ttl_ns,omitempty"`
	// Cost overrides the router's cost model (nil: router.DefaultCost).
	Cost *router.CostModel `json:"cost,omitempty"`
	// KVBM, when set, runs the kvbm connector on every worker (host and
	// disk tiers behind the device pool).
	KVBM *KVBM `json:"kvbm,omitempty"`

	// Disaggregated prefill/decode (disagg.go): prefill and decode pools
	// beside Workers aggregated ones (Workers defaults to 0 then; more make
	// a mixed fleet), and the
	// conditional-disaggregation thresholds on the net new prompt tokens
	// (router.DisaggConfig: defaults 2048 and 0.7; negative tokens: never
	// local for length).
	PrefillWorkers     int     `json:"prefill_workers,omitempty"`
	DecodeWorkers      int     `json:"decode_workers,omitempty"`
	LocalPrefillTokens int     `json:"local_prefill_tokens,omitempty"`
	LocalPrefillRatio  float64 `json:"local_prefill_ratio,omitempty"`
}

// Normalize fills zero fields with their defaults and checks the rest.
func (c Config) Normalize() (Config, error) {
	m, _, _, err := ParseMode(c.Mode)
	if err != nil {
		return c, err
	}
	c.Mode = m
	pd := c.PrefillWorkers != 0 || c.DecodeWorkers != 0
	if c.Workers == 0 && !pd {
		c.Workers = DefaultWorkers
	}
	if pd {
		dc := router.DisaggConfig{LocalPrefillTokens: c.LocalPrefillTokens, LocalPrefillRatio: c.LocalPrefillRatio}.WithDefaults()
		if err := dc.Validate(); err != nil {
			return c, fmt.Errorf("twin: %w", err)
		}
		c.LocalPrefillTokens, c.LocalPrefillRatio = dc.LocalPrefillTokens, dc.LocalPrefillRatio
	} else {
		c.LocalPrefillTokens, c.LocalPrefillRatio = 0, 0 // meaningless without P/D
	}
	if c.BlockSize == 0 {
		c.BlockSize = sim.DefaultBlockSize
	}
	if c.Blocks == 0 {
		c.Blocks = sim.DefaultBlocks
	}
	if c.MaxBatchedTokens == 0 {
		c.MaxBatchedTokens = sim.DefaultMaxBatchedTokens
	}
	if c.MaxSeqs == 0 {
		c.MaxSeqs = sim.DefaultMaxSeqs
	}
	if c.ArrivalSpeedup == 0 {
		c.ArrivalSpeedup = 1
	}
	if c.TransferBandwidth == 0 {
		c.TransferBandwidth = sim.DefaultBandwidth
	}
	if c.KVBytesPerToken == 0 {
		c.KVBytesPerToken = DefaultKVBytesPerToken
	}
	if c.TransferBytesPerBlock == 0 {
		c.TransferBytesPerBlock = int64(c.BlockSize) * c.KVBytesPerToken
	}
	if c.LoadInterval == 0 {
		c.LoadInterval = DefaultLoadInterval
	}
	switch {
	case !pd && (c.Workers < 1 || c.Workers > 1<<16):
		return c, fmt.Errorf("twin: %d workers, want 1 to 65536", c.Workers)
	case pd && (c.PrefillWorkers < 1 || c.DecodeWorkers < 1 || c.Workers < 0 || c.Workers+c.PrefillWorkers+c.DecodeWorkers > 1<<16):
		return c, fmt.Errorf("twin: %d prefill + %d decode + %d aggregated workers, want at least one prefill and one decode worker, 65536 in all", c.PrefillWorkers, c.DecodeWorkers, c.Workers)
	case c.BlockSize < 1 || c.Blocks < 1 || c.MaxBatchedTokens < 1 || c.MaxSeqs < 1:
		return c, errors.New("twin: block size, blocks, max batched tokens and max seqs must be positive")
	case !(c.ArrivalSpeedup > 0) || c.ArrivalSpeedup > 1e9:
		return c, fmt.Errorf("twin: arrival speedup %g, want > 0", c.ArrivalSpeedup)
	case c.Concurrency < 0:
		return c, fmt.Errorf("twin: concurrency %d, want ≥ 0 (0 = open loop)", c.Concurrency)
	case math.IsNaN(c.TransferBandwidth) || math.IsInf(c.TransferBandwidth, 0) || c.KVBytesPerToken < 0 || c.TransferBytesPerBlock < 0:
		return c, errors.New("twin: transfer bandwidth must be finite and KV sizes not negative")
	case c.LoadInterval < 0 || c.ApproxTTL < 0:
		return c, errors.New("twin: load interval and approx TTL must not be negative")
	case c.KVBM != nil:
		if err := c.KVBM.check(); err != nil {
			return c, err
		}
	case c.MaxKVUsage < 0 || c.MaxPrefillTokens < 0:
		return c, errors.New("twin: busy thresholds must not be negative")
	}
	return c, nil
}

type worker struct {
	core *sim.Core
	key  kv.WorkerKey
	// at is the next event: the end of the pass in res when pending, else
	// the start of the next pass; atNS is the same instant in nanoseconds
	// since the twin's start (the event loop compares integers).
	at       time.Time
	atNS     int64
	active   bool
	pending  bool
	reported bool // lastNS holds the last load report
	res      *sim.StepResult
	lastNS   int64
	stalls   int
}

type request struct {
	dec     *router.Decision
	seq     *sim.Seq
	arrival time.Time
	er      engine.Request
	pd      *pdReq // disaggregated: the prefill leg
}

// twin is one run's state.
type twin struct {
	cfg Config
	wl  *Workload
	vc  *clock.Virtual
	r   *router.Router
	ix  *index.Index
	ws  []worker

	// Event times are nanoseconds since t0.
	reqs  []request
	next  int       // next trace request to issue
	t0    time.Time // virtual start
	now   int64     // the twin's time
	vcNow int64     // what vc reads
	ts0   int64     // first trace timestamp
	// Open loop: the arrival time of request cachedNext.
	cachedNext int
	cachedAt   int64
	cachedOK   bool
	issue      []int64
	head       int // closed loop: issue[head:] are pending client issue times
	iter       int // events handled, for the context checks

	ph    *promptHasher // nil: expand and hash every prompt
	tok   []kv.Token
	tails []kv.Token // slab the prompts' partial tails are carved from

	// The hint of the request being added (read by the Fetcher).
	hint *kv.Hint
	pin  []kv.SeqHash // the hinted blocks as the source sim's sequence hashes
	pbuf []byte
	sums []uint64
	lay  [][]byte
	blks []sim.BlockData

	pd *pdState // nil without P/D

	res              Result
	ttft, itl, e2e   []float64
	firstAt, lastFin time.Time
	predicted        int64
}

// Run simulates wl under cfg and returns its measurements. It stops with
// ctx's error when ctx ends.
func Run(ctx context.Context, wl *Workload, cfg Config) (*Result, error) {
	cfg, err := cfg.Normalize()
	if err != nil {
		return nil, err
	}
	if wl == nil || wl.TraceBlockSize <= 0 {
		return nil, errors.New("twin: no workload")
	}
	start, cpu0 := time.Now(), cpuTime()
	t, err := newTwin(wl, cfg)
	if err != nil {
		return nil, err
	}
	defer wl.putHasher(t.ph)
	if err := t.loop(ctx); err != nil {
		t.kvbmResult()
		return nil, err
	}
	if err := t.kvbmResult(); err != nil {
		return nil, err
	}
	// Every decision was closed at its request's end, so the router must
	// be left with no load; anything else is a bug in the twin's wiring.
	for _, l := range t.r.Loads() {
		if l.ActiveRequests != 0 || l.ActivePrefillTokens != 0 || l.ActiveBlocks != 0 {
			return nil, fmt.Errorf("twin: router still books load on %v after the run: %+v", l.Key, l)
		}
	}
	t.finishResult()
	t.res.Wall = time.Since(start)
	if c := cpuTime(); c > 0 {
		t.res.CPU = c - cpu0
	}
	return &t.res, nil
}

func newTwin(wl *Workload, cfg Config) (*twin, error) {
	t := &twin{cfg: cfg, wl: wl, vc: clock.NewVirtual(clock.Epoch), t0: clock.Epoch,
		reqs: make([]request, len(wl.Requests))}
	if len(wl.Requests) > 0 {
		t.ts0 = wl.Requests[0].TimestampMS
	}
	t.cachedNext = -1
	t.ph = wl.takeHasher(cfg.BlockSize)
	t.res = Result{Mode: cfg.Mode, Workers: cfg.Workers, Offered: len(wl.Requests)}
	t.pd = newPD(cfg)
	if t.pd != nil {
		t.res.PrefillWorkers, t.res.DecodeWorkers = cfg.PrefillWorkers, cfg.DecodeWorkers
		t.res.Paths = &PathStats{}
	}
	_, mode, hints, err := ParseMode(cfg.Mode)
	if err != nil {
		return nil, err
	}
	kvMode := mode == router.ModeKV
	rc := router.Config{
		RouterID:         "twin",
		Now:              t.vc.Now,
		Rand:             rand.New(rand.NewPCG(cfg.Seed, 0x7477696e)),
		MaxKVUsage:       cfg.MaxKVUsage,
		MaxPrefillTokens: cfg.MaxPrefillTokens,
		ApproxTTL:        cfg.ApproxTTL,
		Cost:             cfg.Cost,
		Hints:            hints,
		// Requests may queue for long in an overloaded fleet; never let the
		// stale-request sweep free live load.
		MaxRequestAge: 1000 * time.Hour,
	}
	rc.Mode = mode
	if kvMode {
		t.ix = index.New()
		rc.Matcher = t.ix
	}
	r, err := router.New(rc)
	if err != nil {
		return nil, fmt.Errorf("twin: %w", err)
	}
	t.r = r
	t.ws = make([]worker, cfg.Workers+cfg.PrefillWorkers+cfg.DecodeWorkers)
	for i := range t.ws {
		sc := sim.DefaultConfig()
		sc.Model = model
		sc.BlockSize, sc.Blocks = cfg.BlockSize, cfg.Blocks
		sc.MaxBatchedTokens, sc.MaxSeqs = cfg.MaxBatchedTokens, cfg.MaxSeqs
		sc.Worker = kv.WorkerKey{Instance: uint64(i + 1)}
		sc.OmitEventTokens = true
		sc.SpeedupRatio = 0
		sc.TransferBandwidth = cfg.TransferBandwidth
		sc.TransferBytesPerBlock = cfg.TransferBytesPerBlock
		if cfg.KVBM != nil {
			// Real bytes move through the tiers.
			sc.KVBM = cfg.KVBM.sim(t.vc)
		}
		if hints {
			sc.Fetcher = t.fetch
		} else if cfg.KVBM == nil {
			// Payload bytes are only ever read by a peer fetch; without
			// hints, skip filling them for every stored block.
			sc.Layers = 0
		}
		info := router.WorkerInfo{Key: sc.Worker, Model: model, BlockSize: cfg.BlockSize,
			KVBlocks: cfg.Blocks, MaxBatchedTokens: cfg.MaxBatchedTokens}
		if t.pd != nil {
			t.setupCore(i, &sc, &info, hints)
			if sc.Role == kv.RoleDecode {
				sc.KVBM = nil // KVBM runs on the prefill side only
			}
		}
		core, err := sim.NewCore(sc)
		if err != nil {
			return nil, fmt.Errorf("twin: worker %d: %w", i+1, err)
		}
		if kvMode {
			ix := t.ix
			// Apply copies what it keeps, so the core may reuse the batch.
			core.SetTransientEventSink(func(batch []kv.Event) {
				ix.ApplyBatch(batch)
				t.res.IndexEvents += uint64(len(batch))
			})
		}
		t.ws[i] = worker{core: core, key: sc.Worker}
		info.Digest = core.Config().Digest
		info.TierLoad = core.TierLoadMS()
		if hints {
			info.ControlEndpoint = "tcp://twin-worker-" + strconv.Itoa(i+1) + ":1"
			info.HintCapable = true
		}
		if err := r.AddWorker(info); err != nil {
			return nil, fmt.Errorf("twin: %w", err)
		}
	}
	if cfg.Concurrency > 0 {
		for range min(cfg.Concurrency, len(wl.Requests)) {
			t.issue = append(t.issue, 0)
		}
	}
	return t, nil
}

// nextArrival is when the next request is issued, if any is left.
func (t *twin) nextArrival() (int64, bool) {
	if t.cfg.Concurrency == 0 && t.next == t.cachedNext {
		return t.cachedAt, t.cachedOK
	}
	at, ok := t.computeNextArrival()
	if t.cfg.Concurrency == 0 {
		t.cachedNext, t.cachedAt, t.cachedOK = t.next, at, ok
	}
	return at, ok
}

func (t *twin) computeNextArrival() (int64, bool) {
	if t.next >= len(t.wl.Requests) {
		return 0, false
	}
	if t.cfg.Concurrency > 0 {
		if t.head < len(t.issue) {
			return t.issue[t.head], true
		}
		return 0, false
	}
	ms := float64(t.wl.Requests[t.next].TimestampMS - t.ts0)
	return int64(time.Duration(ms * float64(time.Millisecond) / t.cfg.ArrivalSpeedup)), true
}

// loop handles events in time order: the earliest of the next arrival and
// the active workers' next events, an arrival first on ties, then the
// lowest-numbered worker. Once a worker's event is due it keeps handling
// its own events while they come before every other one (by the same
// order), which saves a scan of the fleet per pass and handles exactly the
// same sequence of events.
func (t *twin) loop(ctx context.Context) error {
	for {
		if err := t.tick(ctx); err != nil {
			return err
		}
		cw, cat := -1, int64(0)
		for i := range t.ws {
			if w := &t.ws[i]; w.active && (cw < 0 || w.atNS < cat) {
				cw, cat = i, w.atNS
			}
		}
		// P/D handoffs (decode legs reaching their cores) come after
		// arrivals and before worker events on ties.
		var hat int64
		var hok bool
		if t.pd != nil {
			hat, hok = t.pd.nextHandoff()
		}
		// Arrivals first on ties, so a burst lands in one pass.
		arr, ok := t.nextArrival()
		if ok && (cw < 0 || arr <= cat) && (!hok || arr <= hat) {
			if err := t.arrive(ctx, arr); err != nil {
				return err
			}
			continue
		}
		if hok && (cw < 0 || hat <= cat) {
			if err := t.handoffEvent(); err != nil {
				return err
			}
			continue
		}
		if cw < 0 {
			return nil
		}
		// cw's events stay next while they come before the arrival and
		// before (lower-numbered workers) or not after (higher-numbered)
		// every other worker's next event: no other worker's time changes
		// meanwhile, and only a closed loop's completions add arrivals.
		limit := int64(math.MaxInt64)
		if ok {
			limit = arr
		}
		if hok {
			limit = min(limit, hat)
		}
		for i := range t.ws {
			if w := &t.ws[i]; w.active && i != cw {
				l := w.atNS
				if i > cw {
					l++
				}
				limit = min(limit, l)
			}
		}
		wk := &t.ws[cw]
		for {
			if err := t.workerEvent(cw); err != nil {
				return err
			}
			if !wk.active || wk.atNS >= limit {
				break
			}
			if t.cfg.Concurrency > 0 {
				if arr, ok := t.nextArrival(); ok && arr <= wk.atNS {
					break
				}
			}
			if t.pd != nil {
				// A prefill's end may have scheduled an earlier handoff.
				if hat, ok := t.pd.nextHandoff(); ok && hat <= wk.atNS {
					break
				}
			}
			if err := t.tick(ctx); err != nil {
				return err
			}
		}
	}
}

// tick counts an event and checks ctx every 1024 of them.
func (t *twin) tick(ctx context.Context) error {
	t.iter++
	if t.iter&1023 == 1 {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("twin: %w", err)
		}
	}
	return nil
}

// advance sets the twin's time (events are handled in time order, so it
// never goes back).
func (t *twin) advance(now int64) {
	if now > t.now {
		t.now = now
	}
}

// at is the instant ns after the twin's start.
func (t *twin) at(ns int64) time.Time { return t.t0.Add(time.Duration(ns)) }

// syncClock brings the router's virtual clock to the twin's time; called
// before the router reads it (Route, UpdateLoad) rather than at every event.
func (t *twin) syncClock() {
	if t.now != t.vcNow {
		t.vc.AdvanceTo(t.at(t.now))
		t.vcNow = t.now
	}
}

// arrive routes trace request t.next at atNS and hands it to its worker.
func (t *twin) arrive(ctx context.Context, atNS int64) error {
	i := t.next
	t.next++
	if t.cfg.Concurrency > 0 {
		t.head++
	}
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
	if t.ph != nil {
		rr.Local, rr.PromptLen = t.ph.local(rq, plen), plen
	} else {
		t.tok = appendTokens(t.tok[:0], rq, t.wl.TraceBlockSize)
		rr.Tokens = t.tok
	}
	t.syncClock()
	if t.pd != nil {
		from := kv.NumFullBlocks(plen, t.cfg.BlockSize) * t.cfg.BlockSize
		if t.ph != nil {
			t.tok = t.ph.appendTail(t.tok[:0], rq, from, plen)
		} else {
			rr.Local = kv.LocalHashes(nil, t.tok, t.cfg.BlockSize, kv.Seed("", ""))
			rr.Tokens, rr.PromptLen = nil, plen
			t.tok = t.tok[from:]
		}
		return t.arrivePD(ctx, i, atNS, plen, rr, t.carveTail(t.tok))
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
	if t.ph != nil {
		t.tok = t.ph.appendTail(t.tok[:0], rq, from, plen)
	} else {
		t.tok = t.tok[from:]
	}
	tail := t.carveTail(t.tok)
	st := &t.reqs[i]
	st.er = engine.Request{ID: strconv.Itoa(rq.Line), Sampling: kv.Sampling{MaxTokens: max(rq.OutputLength, 1), Seed: rng64(t.cfg.Seed, i)}}
	t.hint = d.Hint
	if d.Hint != nil {
		t.res.Hints.Hints++
		t.res.Hints.PlannedBlocks += int64(len(d.Hint.Hashes) - int(d.Overlap[kv.NumTiers-1]))
	}
	s, err := t.ws[w].core.AddPrompt(&st.er, sim.Prompt{Len: plen, Local: d.Local, Tail: tail, Seq: d.Seq}, at)
	t.hint = nil
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
	if t.cfg.Concurrency > 0 {
		t.issue = append(t.issue, retry)
	}
}

// carveTail copies a prompt's partial last block into the tail slab: the
// sim keeps the slice until the request ends.
func (t *twin) carveTail(src []kv.Token) []kv.Token {
	if len(src) == 0 {
		return nil
	}
	if cap(t.tails)-len(t.tails) < len(src) {
		t.tails = make([]kv.Token, 0, max(64<<10, len(src)))
	}
	n := len(t.tails)
	t.tails = append(t.tails, src...)
	return t.tails[n:len(t.tails):len(t.tails)]
}

// workerEvent handles worker w's next event: the end of its pending pass
// (outputs reach the router at that time), then the start of the next.
func (t *twin) workerEvent(w int) error {
	wk := &t.ws[w]
	now, nowNS := wk.at, wk.atNS
	t.advance(nowNS)
	if wk.pending {
		wk.pending = false
		if res := wk.res; res.FirstTokens > 0 || res.Finished > 0 {
			t.handle(res, now, nowNS)
		}
	}
	if wk.core.Idle() {
		wk.active = false
	} else {
		res := wk.core.Step(now)
		if res.Seqs == 0 && res.Loading > 0 {
			// Only onboarding in flight: step again when it lands.
			wk.stalls = 0
			wk.at, wk.atNS = res.End, nowNS+int64(res.Duration)
		} else if res.Seqs == 0 {
			// Nothing fits right now; only pinned blocks could cause it.
			if wk.stalls++; wk.stalls > stallLimit {
				return fmt.Errorf("twin: worker %d scheduled nothing for %d passes", w+1, stallLimit)
			}
			wk.at, wk.atNS = now.Add(time.Millisecond), nowNS+int64(time.Millisecond)
		} else {
			wk.stalls = 0
			// res.End is now + res.Duration.
			wk.res, wk.pending, wk.at, wk.atNS = res, true, res.End, nowNS+int64(res.Duration)
			t.res.Passes++
		}
	}
	if !wk.active || !wk.reported || nowNS-wk.lastNS >= int64(t.cfg.LoadInterval) {
		st := wk.core.Stats()
		t.syncClock()
		t.r.UpdateLoad(wk.key, st.UsedBlocks, st.TotalBlocks, st.Running, st.Waiting)
		if t.cfg.KVBM != nil {
			t.r.UpdateOnboarding(wk.key, wk.core.OnboardBacklog(now))
		}
		wk.lastNS, wk.reported = nowNS, true
	}
	return nil
}

// handle delivers a finished pass's first tokens and completions.
func (t *twin) handle(res *sim.StepResult, now time.Time, nowNS int64) {
	for i := range res.Outputs {
		o := &res.Outputs[i]
		if !o.First && o.Finish == kv.FinishNone {
			continue
		}
		st, ok := o.Seq.Tag.(*request)
		if !ok {
			if p, ok := o.Seq.Tag.(*pdReq); ok && o.Finish != kv.FinishNone {
				t.prefillDone(p, o, now, nowNS)
			}
			continue
		}
		if o.First {
			st.dec.FirstToken()
		}
		if o.Finish != kv.FinishNone {
			st.dec.Done()
			t.complete(st, now, nowNS)
		}
	}
}

func (t *twin) complete(st *request, now time.Time, nowNS int64) {
	m := st.seq.Metrics()
	ttft := m.FirstToken.Sub(st.arrival)
	e2e := m.Finished.Sub(st.arrival)
	t.ttft = append(t.ttft, ms(ttft))
	t.e2e = append(t.e2e, ms(e2e))
	if m.OutputTokens > 1 {
		t.itl = append(t.itl, ms(e2e-ttft)/float64(m.OutputTokens-1))
	}
	hm := m // the leg that computed the prompt
	if st.pd != nil {
		if st.pd.preSeq != st.seq {
			t.decodeDone(st.pd, m)
			hm = st.pd.preSeq.Metrics()
			t.res.Preemptions += int64(hm.Preemptions)
		}
		st.pd = nil
	}
	peers := min(hm.FetchedTokens, hm.CachedTokens)
	h := &t.res.Hit
	h.PromptTokens += int64(hm.PromptTokens)
	h.DeviceTokens += int64(hm.CachedTokens - peers - hm.HostTokens - hm.DiskTokens - hm.ObjectTokens)
	h.PeerTokens += int64(peers)
	h.HostTokens += int64(hm.HostTokens)
	h.DiskTokens += int64(hm.DiskTokens)
	h.ObjectTokens += int64(hm.ObjectTokens)
	t.res.OutputTokens += int64(m.OutputTokens)
	t.res.Requests++
	t.res.Preemptions += int64(m.Preemptions)
	if now.After(t.lastFin) {
		t.lastFin = now
	}
	st.dec, st.seq = nil, nil // let the GC have them
	if t.cfg.Concurrency > 0 {
		t.issue = append(t.issue, nowNS)
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// fetch is every core's Fetcher in kv+hints mode: when the request being
// added carries a hint, it copies the hinted blocks the target lacks from
// the source core — pinned while read, payloads checksummed as a transfer
// would send them, verified byte for byte by the target's Insert.
func (t *twin) fetch(_ context.Context, _ *engine.Request, m sim.Missing, into sim.Inserter) error {
	h := t.hint
	if h == nil || len(m.Seq) == 0 {
		return nil
	}
	hs := &t.res.Hints
	src := int(h.Source.Instance) - 1
	if src < 0 || src >= len(t.ws) {
		hs.Errors++
		return fmt.Errorf("twin: hint names unknown source %v", h.Source)
	}
	end := min(len(h.Hashes), m.Start+len(m.Seq))
	if end <= m.Start {
		hs.Misses++ // the target already holds all the source has
		return nil
	}
	// The hint names the source's blocks by its engine hashes; among sims
	// those are the prompt's sequence hashes.
	if h.Hashes[m.Start] != sim.EngineHash(m.Seq[0]) {
		hs.Errors++
		return fmt.Errorf("twin: hint block %d is %016x, the prompt's is %016x", m.Start, h.Hashes[m.Start], m.Seq[0])
	}
	t.pin = t.pin[:0]
	for _, e := range h.Hashes[:end] {
		t.pin = append(t.pin, sim.SeqOf(e))
	}
	core := t.ws[src].core
	held, release := core.Pin(t.pin)
	defer release()
	end = min(end, held)
	if end <= m.Start {
		hs.Misses++ // the source evicted them since it reported them
		return nil
	}
	n, payload, err := t.copyBlocks(src, m, end-m.Start, into)
	hs.FetchedBlocks += int64(n)
	hs.ModelledBytes += int64(n) * t.cfg.TransferBytesPerBlock
	hs.PayloadBytes += int64(payload)
	if err != nil {
		hs.Errors++
	}
	return err
}

// copyBlocks copies the first nb blocks of m from worker src's core into
// into: each layer's payload read, checksummed as a transfer would send it
// and verified byte for byte by Insert. It returns the blocks inserted and
// the payload bytes they carried.
func (t *twin) copyBlocks(src int, m sim.Missing, nb int, into sim.Inserter) (int, int, error) {
	core := t.ws[src].core
	sc := core.Config()
	layers, psize := sc.Layers, sc.PayloadSize
	if need := nb * layers * psize; cap(t.pbuf) < need {
		t.pbuf = make([]byte, need)
	}
	if cap(t.sums) < nb*layers {
		t.sums = make([]uint64, nb*layers)
		t.lay = make([][]byte, nb*layers)
	}
	t.blks = t.blks[:0]
	for b := 0; b < nb; b++ {
		seq := m.Seq[b]
		for l := 0; l < layers; l++ {
			k := b*layers + l
			buf := t.pbuf[k*psize : (k+1)*psize]
			if _, err := core.ReadPayload(seq, l, buf); err != nil {
				return 0, 0, fmt.Errorf("twin: read block from worker %d: %w", src+1, err)
			}
			t.sums[k] = kv.Checksum(buf)
			t.lay[k] = buf
		}
		t.blks = append(t.blks, sim.BlockData{Local: m.Local[b], Seq: seq,
			Layers: t.lay[b*layers : (b+1)*layers], Sums: t.sums[b*layers : (b+1)*layers]})
	}
	n, err := into.Insert(sim.Chain{HasParent: m.HasParent, Parent: m.Parent, Blocks: t.blks})
	if err != nil {
		err = fmt.Errorf("twin: insert blocks from worker %d: %w", src+1, err)
	}
	return n, n * layers * psize, err
}

// finishResult turns the collected samples into the Result.
func (t *twin) finishResult() {
	r := &t.res
	r.TTFT, r.ITL, r.E2E = newDist(t.ttft), newDist(t.itl), newDist(t.e2e)
	r.TTFTSamples, r.ITLSamples = t.ttft, t.itl
	r.Rejected = r.RejectedBusy + r.RejectedInvalid
	if !t.lastFin.IsZero() {
		r.SimSeconds = t.lastFin.Sub(t.firstAt).Seconds()
	}
	if r.SimSeconds > 0 {
		r.OutputTokPerS = float64(r.OutputTokens) / r.SimSeconds
		r.ReqPerS = float64(r.Requests) / r.SimSeconds
	}
	h := &r.Hit
	if h.PromptTokens > 0 {
		p := float64(h.PromptTokens)
		h.Device = float64(h.DeviceTokens) / p
		h.Peers = float64(h.PeerTokens) / p
		h.Host, h.Disk, h.Object = float64(h.HostTokens)/p, float64(h.DiskTokens)/p, float64(h.ObjectTokens)/p
		h.Total = float64(h.DeviceTokens+h.PeerTokens+h.HostTokens+h.DiskTokens+h.ObjectTokens) / p
		r.PredictedHit = float64(t.predicted) / p
	}
	t.finishPD()
	for i := range t.ws {
		c := t.ws[i].core.Counters()
		r.EvictedBlocks += int64(c.EvictedBlocks)
		r.FetchErrors += int64(c.FetchErrors)
	}
}
