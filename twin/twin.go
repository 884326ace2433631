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
// With a second core the index applies the cores' KV events on a goroutine
// of its own, synchronised before every read of the index (feed.go).
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
	// Queue, when set, puts the router queue with admission in front of
	// the workers (queue.go; with P/D it holds the legs, disagg.go).
	Queue *Queue `json:"queue,omitempty"`

	PrefillWorkers     int     `json:"prefill_workers,omitempty"`
	DecodeWorkers      int     `json:"decode_workers,omitempty"`
	LocalPrefillTokens int     `json:"local_prefill_tokens,omitempty"`
	LocalPrefillRatio  float64 `json:"local_prefill_ratio,omitempty"`

	// serialIndex applies KV events on the event loop's goroutine even
	// with a second core (feed.go); tests compare both ways.
	serialIndex bool
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
	if c.Queue != nil {
		if _, err := router.NewQueue[struct{}](c.Queue.QueueConfig); err != nil {
			return c, fmt.Errorf("twin: %w", err)
		}
	}
	return c, nil
}

type request struct {
	dec     *router.Decision
	seq     *sim.Seq
	arrival time.Time
	er      engine.Request
	pd      *pdReq // disaggregated: the prefill leg
}

// twin is one run's state: the fleet (cores, router, index) and the
// event loop's clock (loop.go), the arrivals (arrivals.go), the P/D part
// (disagg.go), the block copies of hints and handoffs (fetch.go) and what
// the run measures (record.go).
type twin struct {
	cfg Config
	wl  *Workload
	vc  *clock.Virtual
	r   *router.Router
	ix  *index.Index
	// feed applies ix's events on a second goroutine (nil: the event
	// loop applies them as they are flushed).
	feed *indexFeed
	ws   []worker

	// Event times are nanoseconds since t0.
	reqs  []request
	t0    time.Time // virtual start
	now   int64     // the twin's time
	vcNow int64     // what vc reads
	iter  int       // events handled, for the context checks

	arr    arrivals
	q      *router.Queue[queued] // nil without Config.Queue
	chg    uint64                // counts the workers' changes (touch)
	woke   bool                  // a worker was woken since the loop last looked
	prompt promptBufs
	copier blockCopier
	pd     *pdState // nil without P/D

	results
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
	defer wl.putHasher(t.prompt.ph)
	if t.feed != nil {
		defer t.feed.close()
	}
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
	if t.feed != nil {
		t.res.IndexOffLoop = t.feed.offLoopShare()
	}
	t.res.Wall = time.Since(start)
	if c := cpuTime(); c > 0 {
		t.res.CPU = c - cpu0
	}
	return &t.res, nil
}

func newTwin(wl *Workload, cfg Config) (*twin, error) {
	t := &twin{cfg: cfg, wl: wl, vc: clock.NewVirtual(clock.Epoch), t0: clock.Epoch,
		reqs: make([]request, len(wl.Requests)), arr: newArrivals(wl, cfg)}
	t.prompt.ph = wl.takeHasher(cfg.BlockSize)
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
	if cfg.Queue != nil {
		a := cfg.Queue.Admit
		rc.Admit = &a
		rc.CreditRouted = true
		if t.q, err = router.NewQueue[queued](cfg.Queue.QueueConfig); err != nil {
			return nil, fmt.Errorf("twin: %w", err)
		}
		t.res.Queue = &QueueStats{Policy: string(t.q.Config().Policy)}
	}
	rc.Mode = mode
	if mode != router.ModeKVApprox {
		// kv routes by the index; round-robin and random measure their
		// routing regret against it.
		t.ix = index.New()
		rc.Matcher = t.ix
		if asyncIndexFeed(cfg) {
			t.feed = newIndexFeed(t.ix)
			rc.Matcher = syncedIndex{t.feed}
		}
	}
	r, err := router.New(rc)
	if err != nil {
		return nil, fmt.Errorf("twin: %w", err)
	}
	t.r = r
	t.ws = make([]worker, cfg.Workers+cfg.PrefillWorkers+cfg.DecodeWorkers)
	for i := range t.ws {
		if err := t.addCore(i, hints, kvMode); err != nil {
			return nil, err
		}
	}
	if t.feed != nil {
		t.feed.start()
	}
	return t, nil
}

// addCore builds worker i's sim core (its role's shape with P/D, fed to
// the index in kv modes) and adds it to the router.
func (t *twin) addCore(i int, hints, kvMode bool) error {
	cfg := t.cfg
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
		return fmt.Errorf("twin: worker %d: %w", i+1, err)
	}
	if ix, feed := t.ix, t.feed; ix != nil {
		// Apply and the feed copy what they keep, so the core may reuse
		// the batch. Only kv routes by the index: the others' count
		// stays 0.
		core.SetTransientEventSink(func(batch []kv.Event) {
			if feed != nil {
				feed.add(batch)
			} else {
				ix.ApplyBatch(batch)
			}
			if kvMode {
				t.res.IndexEvents += uint64(len(batch))
			}
		})
	}
	t.ws[i] = worker{core: core, key: sc.Worker}
	info.Digest = core.Config().Digest
	info.TierLoad = core.TierLoadMS()
	if hints {
		info.ControlEndpoint = "tcp://twin-worker-" + strconv.Itoa(i+1) + ":1"
		info.HintCapable = true
	}
	if err := t.r.AddWorker(info); err != nil {
		return fmt.Errorf("twin: %w", err)
	}
	return nil
}
