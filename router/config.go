package router

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Mode selects how the router picks a worker.
type Mode string

const (
	ModeRoundRobin Mode = "round-robin" // next worker in key order
	ModeRandom     Mode = "random"      // uniform over non-busy workers
	ModeKV         Mode = "kv"          // cost model over an event-fed index
	ModeKVApprox   Mode = "kv-approx"   // cost model over the router's own routing history
)

// Modes lists every mode, in the order help texts name them.
var Modes = []Mode{ModeRoundRobin, ModeRandom, ModeKV, ModeKVApprox}

// ModeList names the modes for help and error texts:
// "round-robin, random, kv or kv-approx".
func ModeList() string {
	names := make([]string, len(Modes))
	for i, m := range Modes {
		names[i] = string(m)
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// ParseMode accepts the names above, in any case.
func ParseMode(s string) (Mode, error) {
	m := Mode(strings.ToLower(strings.TrimSpace(s)))
	for _, x := range Modes {
		if m == x {
			return m, nil
		}
	}
	return "", fmt.Errorf("unknown router mode %q (want %s)", s, ModeList())
}

// Config configures a Router. The zero value of every field picks the
// default noted beside it.
type Config struct {
	Mode Mode // default ModeKV when Matcher is set, else ModeRoundRobin

	// Matcher is the event-fed index (kv mode; required there). Round-robin
	// and random only read it to measure routing regret
	// (Decision.ReachableTokens).
	Matcher Matcher
	// Approx is the approximate index of kv-approx mode, and of kv mode's
	// workers without KV events. Nil: the router builds one with
	// NewApprox(ApproxTTL).
	Approx ApproxIndex
	// NewApprox builds the approximate index when Approx is nil; default
	// DefaultApprox (index.NewApprox).
	NewApprox func(ttl time.Duration) ApproxIndex
	ApproxTTL time.Duration // default 120 s

	// Cost is the cost model (DESIGN.md §5); nil: DefaultCost().
	Cost *CostModel

	// Busy thresholds; zero disables each. A worker is busy when any is
	// exceeded; when every candidate is busy Route returns a *kv.BusyError.
	MaxKVUsage       float64       // fraction of KV blocks in use (reported or estimated)
	MaxPrefillTokens int64         // active prefill tokens
	MaxPrefillFrac   float64       // active prefill tokens / worker's MaxBatchedTokens
	BusyRetryAfter   time.Duration // suggestion in kv.BusyError, default 1 s
	// Admit, when set, adds the admission stage (AdmitConfig): a request
	// no candidate can admit gets a *kv.BusyError, which the owner of a
	// router queue (Queue) answers by holding it until one can.
	Admit *AdmitConfig
	// InhibitFor is how long Inhibit (or Decision.Fail) keeps a worker out
	// of selection and out of hint sources; default DefaultInhibitFor.
	// Discovery removes a dead worker for good once its record lapses.
	InhibitFor    time.Duration
	LoadReportTTL time.Duration // how long an UpdateLoad report counts, default 10 s

	// NoBlockTracking books only prefill tokens, not active blocks: for
	// prefill pools, whose blocks leave with the request (Dynamo runs its
	// prefill router with track_active_blocks off).
	NoBlockTracking bool

	// CreditRouted counts the prompt blocks of the requests routed to a
	// worker and not yet done as held on its device, before its KV events
	// say so (the index learns a block only once computed): a burst
	// sharing a new prefix lands on the worker computing it, and a
	// conversation's next turn follows its previous one while that one
	// still runs. Its credit ends with the request (Done), when the
	// index has the blocks, so no TTL is needed.
	CreditRouted bool

	// Hints turns on hint planning (kv mode only: the planner trusts the
	// index to say who really holds blocks).
	Hints bool
	// HintPolicy, when set, chooses each hint's source among the eligible
	// ones (or none); nil picks the longest prefix, ties to the lowest key.
	HintPolicy HintPolicy

	// RouterID names this replica in replica-sync messages and decision
	// ids; default a random 8-hex-digit id.
	RouterID string
	// OnReplicaEvent receives every load change this router makes, to be
	// published to other replicas. It is called synchronously, outside the
	// router's lock; the event's slices are only valid during the call.
	OnReplicaEvent func(ReplicaEvent)

	// Stale-request expiry: requests older than MaxRequestAge are freed
	// (a lost Done must not pin load forever); checked at most every
	// SweepInterval. Defaults 1 h and 30 s.
	MaxRequestAge time.Duration
	SweepInterval time.Duration

	// Logger receives the router's warnings; default slog.Default().
	Logger *slog.Logger

	Now        func() time.Time      // default time.Now; the twin passes virtual time
	Rand       *rand.Rand            // default seeded from the runtime; guarded by the router
	Registerer prometheus.Registerer // nil: metrics are kept but not registered
}

// DefaultInhibitFor is Config.InhibitFor's default.
const DefaultInhibitFor = 5 * time.Second

// CostModel weighs a worker's cached prefix against its load. Both kinds
// credit the cached prefix per tier:
//
//	credit  = Device·device + Host·host_only + Disk·disk_only + External·object_only   (blocks)
//
// Kind CostBlocks (or empty; DESIGN.md §5) counts blocks:
//
//	prefill = max((active_prefill_tokens + ISL)/block_size − credit, 0)
//	cost    = PrefillScale·prefill + decode_blocks
//
// Kind CostTime predicts the time to first token in ms from the worker's
// Timing (see timeCost): the prefill queued on the worker plus this
// request's uncached tokens, through the prefill polynomial in chunks of
// the worker's MaxBatchedTokens, plus a decode step per pass at the
// worker's KV usage; PrefillScale weighs the prefill part and WorkWeight
// adds the request's own prefill time again, as the delay it imposes on
// the worker's later requests.
//
// Temperature 0 picks the minimum (ties at random); T > 0 samples a
// softmax over min–max normalised costs.
type CostModel struct {
	Kind               CostKind
	Device, Host, Disk float64
	// External credits a block only the object tier (G4, kv.TierExternal)
	// holds: a network read and a host bounce away.
	External     float64
	PrefillScale float64
	// WorkWeight (CostTime only) weighs the request's own prefill time,
	// counted on top of its TTFT; 0 makes the time model pure TTFT.
	WorkWeight  float64
	Temperature float64
}

// DefaultCost is the router's default cost model: TimeCost, which beats
// BlockCost on hit ratio and TTFT in the twin (docs/benchmarks.md §1).
func DefaultCost() CostModel { return TimeCost() }

// BlockCost is DESIGN.md §5's block model with Dynamo's defaults: credits
// 1.0/0.75/0.25, prefill scale 1, T 0; object-tier blocks earn 0.1 (Dynamo
// routes on G1–G3 only; an object read is slower than disk).
func BlockCost() CostModel {
	return CostModel{Kind: CostBlocks, Device: 1, Host: 0.75, Disk: 0.25, External: 0.1, PrefillScale: 1}
}

// TimeCost is the time model (predicted TTFT in ms plus twice the
// request's own prefill time) with the same tier credits. WorkWeight 2 was
// chosen on the twin: 1 gives hit 0.258 (0.245 at 4× load), 2 gives 0.261
// (0.253), 3–4 buy little more hit for a worse TTFT tail.
func TimeCost() CostModel {
	return CostModel{Kind: CostTime, Device: 1, Host: 0.75, Disk: 0.25, External: 0.1, PrefillScale: 1, WorkWeight: 2}
}

// CostByKind returns the defaults of a cost kind ("" is DefaultCost).
func CostByKind(k CostKind) (CostModel, error) {
	switch k {
	case "":
		return DefaultCost(), nil
	case CostBlocks:
		return BlockCost(), nil
	case CostTime:
		return TimeCost(), nil
	}
	return CostModel{}, fmt.Errorf("%w: unknown cost kind %q (want blocks or time)", errConfig, k)
}

func (m CostModel) validate() error {
	switch m.Kind {
	case "", CostBlocks, CostTime:
	default:
		return fmt.Errorf("%w: cost kind %q (want blocks or time)", errConfig, m.Kind)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"Device", m.Device}, {"Host", m.Host}, {"Disk", m.Disk}, {"External", m.External}, {"PrefillScale", m.PrefillScale}, {"WorkWeight", m.WorkWeight}, {"Temperature", m.Temperature}} {
		if !(f.v >= 0) || math.IsInf(f.v, 0) {
			return fmt.Errorf("%w: cost %s %v must be finite and ≥ 0", errConfig, f.name, f.v)
		}
	}
	return nil
}

var errConfig = errors.New("router config")

func (c *Config) fill() error {
	if err := c.fillMode(); err != nil {
		return err
	}
	if c.Cost == nil {
		d := DefaultCost()
		c.Cost = &d
	} else {
		cm := *c.Cost // a private copy: the caller may reuse theirs
		c.Cost = &cm
	}
	if err := c.Cost.validate(); err != nil {
		return err
	}
	if c.MaxKVUsage < 0 || c.MaxPrefillTokens < 0 || c.MaxPrefillFrac < 0 {
		return fmt.Errorf("%w: busy thresholds must be ≥ 0", errConfig)
	}
	if c.Admit != nil {
		a := *c.Admit // a private copy, as for Cost
		if err := a.fill(); err != nil {
			return err
		}
		c.Admit = &a
	}
	c.fillDefaults()
	return nil
}

// fillMode defaults the mode and checks the index it needs, building
// kv-approx's when none is given.
func (c *Config) fillMode() error {
	if c.Mode == "" {
		if c.Matcher != nil {
			c.Mode = ModeKV
		} else {
			c.Mode = ModeRoundRobin
		}
	}
	if _, err := ParseMode(string(c.Mode)); err != nil {
		return fmt.Errorf("%w: %w", errConfig, err)
	}
	if c.Mode == ModeKV && c.Matcher == nil {
		return fmt.Errorf("%w: mode kv needs a Matcher (the event index)", errConfig)
	}
	if c.ApproxTTL == 0 {
		c.ApproxTTL = 120 * time.Second
	}
	if c.ApproxTTL < 0 {
		return fmt.Errorf("%w: ApproxTTL %v is negative", errConfig, c.ApproxTTL)
	}
	// kv mode keeps one too, for workers without KV events (NoKVEvents).
	if (c.Mode == ModeKVApprox || c.Mode == ModeKV) && c.Approx == nil {
		if c.NewApprox == nil {
			c.NewApprox = DefaultApprox
		}
		c.Approx = c.NewApprox(c.ApproxTTL)
	}
	return nil
}

// fillDefaults sets the zero durations, clock, logger, random source and
// router id to their defaults.
func (c *Config) fillDefaults() {
	if c.BusyRetryAfter <= 0 {
		c.BusyRetryAfter = time.Second
	}
	if c.LoadReportTTL <= 0 {
		c.LoadReportTTL = 10 * time.Second
	}
	if c.MaxRequestAge <= 0 {
		c.MaxRequestAge = time.Hour
	}
	if c.SweepInterval <= 0 {
		c.SweepInterval = 30 * time.Second
	}
	if c.InhibitFor <= 0 {
		c.InhibitFor = DefaultInhibitFor
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Rand == nil {
		c.Rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	if c.RouterID == "" {
		c.RouterID = fmt.Sprintf("%08x", rand.Uint32())
	}
}
