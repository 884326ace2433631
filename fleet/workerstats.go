package fleet

import (
	"cmp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/eventplane"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/router"
)

// workerStats is the fleet's per-worker view, kept from what the frontend
// already receives: the workers' load reports and the requests it sends
// them. It exports it as Prometheus series (one per worker key, labelled
// model, instance, dp_rank and role) and as the dashboard's status.
type workerStats struct {
	instances *instances
	now       func() time.Time

	mu    sync.Mutex
	load  map[kv.WorkerKey]loadSample
	count map[kv.WorkerKey]*workerCounts
}

type loadSample struct {
	eventplane.LoadReport
	at time.Time
}

// workerCounts are the requests the frontend sent one worker key and what
// their streams carried back. A stream holds its worker's counts and adds
// to them without a lock.
type workerCounts struct {
	requests, hinted, prompt, cached, output atomic.Uint64
	// routedPrompt: prompt tokens routed on legs that compute the prompt;
	// credited: of those, what the router credited as cached, per tier
	// (creditTiers).
	routedPrompt atomic.Uint64
	credited     [numCreditTiers]atomic.Uint64
	// cachedBy: the cached tokens the worker reported, by source
	// (creditTiers too: the same tiers, then peer).
	cachedBy [numCreditTiers]atomic.Uint64
}

// creditTiers name where the router found a routed prompt's cached prefix:
// the worker's own tiers, then peer (a KV hint's prefix from another
// worker, beyond what the worker holds).
var creditTiers = func() (out [numCreditTiers]string) {
	for i := range out {
		out[i] = kv.CachedSourceName(i)
	}
	return out
}()

const numCreditTiers = len(kv.CachedByTier{})

// credit counts what the router credited d's worker with: the prompt, and
// the cached prefix by tier. A disaggregated decode leg computes no prompt
// (its KV arrives from the prefill worker) and is not counted.
func (c *workerCounts) credit(d *router.Decision) {
	bs := uint64(max(d.BlockSize, 0))
	c.routedPrompt.Add(uint64(max(d.ISL, 0)))
	for t, n := range d.TierBlocks() {
		if n > 0 {
			c.credited[t].Add(uint64(n) * bs)
		}
	}
	if d.Hint != nil {
		if n := len(d.Hint.Hashes) - int(d.Overlap[kv.NumTiers-1]); n > 0 {
			c.credited[kv.PeerCached].Add(uint64(n) * bs)
		}
	}
}

// chunk counts what one chunk of a stream carried: output tokens, and with
// the final usage the prompt and the part of it the worker had cached,
// in all and by source.
func (c *workerCounts) chunk(tokens, prompt, cached int, by kv.CachedByTier) {
	if tokens > 0 {
		c.output.Add(uint64(tokens))
	}
	if prompt > 0 {
		c.prompt.Add(uint64(prompt))
		c.cached.Add(uint64(max(cached, 0)))
		for i, n := range by {
			if n > 0 {
				c.cachedBy[i].Add(uint64(n))
			}
		}
	}
}

func newWorkerStats(in *instances) *workerStats {
	return &workerStats{instances: in, now: time.Now, load: map[kv.WorkerKey]loadSample{}, count: map[kv.WorkerKey]*workerCounts{}}
}

func (s *workerStats) onLoad(r eventplane.LoadReport) {
	k := kv.WorkerKey{Instance: r.Instance, DPRank: r.DPRank}
	s.mu.Lock()
	s.load[k] = loadSample{LoadReport: r, at: s.now()}
	s.mu.Unlock()
}

func (s *workerStats) counts(k kv.WorkerKey) *workerCounts {
	c := s.count[k]
	if c == nil {
		c = &workerCounts{}
		s.count[k] = c
	}
	return c
}

// routed counts a request sent to d's worker, with a KV hint or not, and
// (when its leg computes the prompt) what the router credited it with;
// it returns the worker's counts for its stream.
func (s *workerStats) routed(d *router.Decision, computesPrompt bool) *workerCounts {
	s.mu.Lock()
	c := s.counts(d.Worker)
	s.mu.Unlock()
	c.requests.Add(1)
	if d.Hint != nil {
		c.hinted.Add(1)
	}
	if computesPrompt {
		c.credit(d)
	}
	return c
}

// WorkerStatus is one worker key as the dashboard shows it.
type WorkerStatus struct {
	Model    string  `json:"model"`
	Instance string  `json:"instance"`
	DPRank   uint32  `json:"dp_rank"`
	Role     kv.Role `json:"role"`
	GRPC     string  `json:"grpc,omitempty"`
	// Engine is the engine kind the worker registered (sim, vllm, …).
	Engine string `json:"engine,omitempty"`
	// Hints: the worker takes KV hints or serves its blocks to peers.
	Hints bool `json:"hints"`
	// State: "ready" once a load report came in, "starting" before.
	State string `json:"state"`
	// KVCapacity is the blocks per tier the worker registered.
	KVCapacity map[string]int `json:"kv_capacity,omitempty"`
	// From the latest load report.
	UsedBlocks    int     `json:"used_blocks"`
	TotalBlocks   int     `json:"total_blocks"`
	Running       int     `json:"running"`
	Waiting       int     `json:"waiting"`
	PrefillQueued int     `json:"prefill_tokens_queued"`
	LoadAgeS      float64 `json:"load_age_s"`
	// Counted by this frontend since it started.
	Requests     uint64 `json:"requests"`
	HintsPlanned uint64 `json:"hints_planned"`
	PromptTokens uint64 `json:"prompt_tokens"`
	CachedTokens uint64 `json:"cached_prompt_tokens"`
	// CachedByTier splits CachedTokens by where the worker found them
	// (device, host, disk, external, peer): the actual hit by tier.
	CachedByTier map[string]uint64 `json:"cached_prompt_tokens_by_tier,omitempty"`
	OutputTokens uint64            `json:"output_tokens"`
	// RoutedPromptTokens and, by tier (device, host, disk, external,
	// peer), the part the router credited as cached.
	RoutedPromptTokens uint64            `json:"routed_prompt_tokens"`
	CreditedTokens     map[string]uint64 `json:"credited_cached_tokens,omitempty"`
}

// status lists every worker key in the instance table, by model, instance
// and rank.
func (s *workerStats) status() []WorkerStatus {
	ins := s.instances.snapshot()
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []WorkerStatus
	for _, in := range ins {
		for _, k := range in.Workers() {
			w := WorkerStatus{Model: in.Model, Instance: natsbus.InstanceToken(in.ID), DPRank: k.DPRank, Role: in.Role,
				GRPC: in.GRPCAddr, State: "starting", KVCapacity: in.KVCapacity, Engine: in.Engine,
				Hints: in.HintTarget() || len(in.ControlEndpoints) > 0}
			if l, ok := s.load[k]; ok {
				w.State = "ready"
				w.UsedBlocks, w.TotalBlocks, w.Running, w.Waiting = l.UsedBlocks, l.TotalBlocks, l.Running, l.Waiting
				w.PrefillQueued, w.LoadAgeS = l.PendingPrefillTokens, now.Sub(l.at).Seconds()
			}
			if c := s.count[k]; c != nil {
				w.Requests, w.HintsPlanned, w.PromptTokens = c.requests.Load(), c.hinted.Load(), c.prompt.Load()
				w.CachedTokens, w.OutputTokens = c.cached.Load(), c.output.Load()
				w.RoutedPromptTokens = c.routedPrompt.Load()
				w.CreditedTokens = make(map[string]uint64, numCreditTiers)
				w.CachedByTier = make(map[string]uint64, numCreditTiers)
				for t, name := range creditTiers {
					w.CreditedTokens[name] = c.credited[t].Load()
					w.CachedByTier[name] = c.cachedBy[t].Load()
				}
			}
			out = append(out, w)
		}
	}
	// Forget the load and counts of keys that left the table.
	live := map[kv.WorkerKey]bool{}
	for _, in := range ins {
		for _, k := range in.Workers() {
			live[k] = true
		}
	}
	for k := range s.load {
		if !live[k] {
			delete(s.load, k)
		}
	}
	for k := range s.count {
		if !live[k] {
			delete(s.count, k)
		}
	}
	slices.SortFunc(out, func(a, b WorkerStatus) int {
		if a.Model != b.Model {
			return cmp.Compare(a.Model, b.Model)
		}
		if a.Instance != b.Instance {
			return cmp.Compare(a.Instance, b.Instance)
		}
		return int(a.DPRank) - int(b.DPRank)
	})
	return out
}

var workerLabels = []string{"model", "instance", "dp_rank", "role"}

func workerDesc(name, help string, extra ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, append(slices.Clone(workerLabels), extra...), nil)
}

// The per-worker series; docs/metrics.md lists them.
var (
	descUp            = workerDesc("kvmesh_fleet_worker_up", "1 for every worker key (instance and DP rank) in the frontend's instance table.")
	descBlocksUsed    = workerDesc("kvmesh_fleet_worker_kv_blocks_used", "KV blocks in use on the worker, by tier, from its latest load report.", "tier")
	descBlocksTotal   = workerDesc("kvmesh_fleet_worker_kv_blocks", "KV block capacity of the worker, by tier: the load report's device total, the registered capacity of other tiers.", "tier")
	descRunning       = workerDesc("kvmesh_fleet_worker_running_requests", "Requests the worker's engine is running, from its latest load report.")
	descWaiting       = workerDesc("kvmesh_fleet_worker_waiting_requests", "Requests queued on the worker's engine, from its latest load report.")
	descPrefillQueued = workerDesc("kvmesh_fleet_worker_prefill_queued_tokens", "Prompt tokens waiting for prefill on the worker, from its latest load report.")
	descLoadAge       = workerDesc("kvmesh_fleet_worker_load_report_age_seconds", "Seconds since the worker's latest load report reached this frontend.")
	descRequests      = workerDesc("kvmesh_fleet_worker_requests_total", "Requests this frontend routed to the worker (each migration attempt counts).")
	descHints         = workerDesc("kvmesh_fleet_worker_kv_hints_planned_total", "Requests routed to the worker with a KV hint to fetch a longer prefix from a peer.")
	descPrompt        = workerDesc("kvmesh_fleet_worker_prompt_tokens_total", "Prompt tokens of the worker's finished requests, from their usage.")
	descCached        = workerDesc("kvmesh_fleet_worker_cached_prompt_tokens_total", "Prompt tokens the worker served from its prefix cache; over kvmesh_fleet_worker_prompt_tokens_total it is the actual (not predicted) hit ratio.")
	descCachedByTier  = workerDesc("kvmesh_fleet_worker_cached_prompt_tokens_by_tier_total", "Of kvmesh_fleet_worker_cached_prompt_tokens_total, the tokens by where the worker found them, as it reported them in each request's usage: its device, host, disk or external (object) tier, or peer (fetched from another worker: a KV hint's prefix, a decode leg's handoff); over kvmesh_fleet_worker_prompt_tokens_total it is the actual hit ratio by tier, beside the router's kvmesh_fleet_worker_credited_prompt_tokens_total.", "tier")
	descOutput        = workerDesc("kvmesh_fleet_worker_output_tokens_total", "Tokens the worker streamed back to this frontend.")
	descRoutedPrompt  = workerDesc("kvmesh_fleet_worker_routed_prompt_tokens_total", "Prompt tokens this frontend routed to the worker on legs that compute the prompt (all but disaggregated decode legs).")
	descCredited      = workerDesc("kvmesh_fleet_worker_credited_prompt_tokens_total", "Of kvmesh_fleet_worker_routed_prompt_tokens_total, the tokens the router credited as cached, by the tier holding them (device, host, disk, external) or peer (a KV hint's prefix fetched from another worker); the ratio is the hit ratio by tier the router counted on.", "tier")
)

func (s *workerStats) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descUp, descBlocksUsed, descBlocksTotal, descRunning, descWaiting, descPrefillQueued,
		descLoadAge, descRequests, descHints, descPrompt, descCached, descCachedByTier, descOutput, descRoutedPrompt, descCredited} {
		ch <- d
	}
}

func (s *workerStats) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	counter := func(d *prometheus.Desc, v uint64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
	}
	for _, w := range s.status() {
		l := []string{w.Model, w.Instance, strconv.FormatUint(uint64(w.DPRank), 10), string(w.Role)}
		gauge(descUp, 1, l...)
		dev := kv.TierDevice.String()
		for tier, n := range w.KVCapacity {
			if tier != dev {
				gauge(descBlocksTotal, float64(n), append(l, tier)...)
			}
		}
		counter(descRequests, w.Requests, l...)
		counter(descHints, w.HintsPlanned, l...)
		counter(descPrompt, w.PromptTokens, l...)
		counter(descCached, w.CachedTokens, l...)
		for _, tier := range creditTiers {
			counter(descCachedByTier, w.CachedByTier[tier], append(l, tier)...)
		}
		counter(descOutput, w.OutputTokens, l...)
		counter(descRoutedPrompt, w.RoutedPromptTokens, l...)
		for _, tier := range creditTiers {
			counter(descCredited, w.CreditedTokens[tier], append(l, tier)...)
		}
		if w.State != "ready" {
			continue // no load report yet: no load series rather than zeros
		}
		gauge(descBlocksUsed, float64(w.UsedBlocks), append(l, dev)...)
		gauge(descBlocksTotal, float64(w.TotalBlocks), append(l, dev)...)
		gauge(descRunning, float64(w.Running), l...)
		gauge(descWaiting, float64(w.Waiting), l...)
		gauge(descPrefillQueued, float64(w.PrefillQueued), l...)
		gauge(descLoadAge, w.LoadAgeS, l...)
	}
}

// snapshot copies the instance table, ordered by id.
func (t *instances) snapshot() []discovery.Instance {
	t.mu.Lock()
	out := make([]discovery.Instance, 0, len(t.byID))
	for _, in := range t.byID {
		out = append(out, in)
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b discovery.Instance) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// FleetStatus is the dashboard's view of the fleet: every worker key.
type FleetStatus struct {
	Workers []WorkerStatus `json:"workers"`
	// Warnings are /health's (Cluster.Warnings), shown above the workers.
	Warnings []string `json:"warnings,omitempty"`
}

// FleetStatus reports every worker the frontend knows, with its latest
// load and what this frontend sent it (the dashboard's data); without
// addresses, the workers' gRPC addresses are left out.
func (c *Cluster) FleetStatus(addresses bool) any {
	ws := c.stats.status()
	if !addresses {
		for i := range ws {
			ws[i].GRPC = ""
		}
	}
	return FleetStatus{Workers: ws, Warnings: c.Warnings()}
}
