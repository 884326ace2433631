package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/kvcr"
)

// kvcrFlags are the worker's KVCR linker inventory flags (SGLang's
// unified-cache external linker with the kvcr backend) and the engine
// topology flags its gates read.
type kvcrFlags struct {
	on                 bool
	endpoint, replay   string
	extraConfig, owner string
	topo               kvcr.Topology
	dp                 int // --dp, --dp-size's alias
	lc                 kvcr.LinkerConfig
	endpoints          []string
	serverInfoTimeout  time.Duration
}

func (k *kvcrFlags) register(f *pflag.FlagSet) {
	f.BoolVar(&k.on, "kvcr-inventory", false, "real engine: take the KVCR linker's inventory (SGLang --enable-unified-cache-external-linker --unified-cache-external-linker-backend kvcr) through a state agent and advertise the engine's KVCR control endpoints once it validates; TP 1 only")
	f.StringVar(&k.endpoint, "kvcr-inventory-endpoint", "", "kvcr: the linker's inventory publisher, tcp://HOST:PORT")
	f.StringVar(&k.replay, "kvcr-inventory-replay", "", "kvcr: the linker's inventory replay endpoint, tcp://HOST:PORT (repairs gaps)")
	f.StringVar(&k.extraConfig, "kvcr-extra-config", "", "kvcr: KVCR's extra config, the JSON (or @file) given to the engine's --hicache-storage-backend-extra-config (publish_inventory, advertise_host, control_port)")
	f.StringVar(&k.owner, "kvcr-cache-owner", "", "kvcr: refuse inventory of any cache owner but this one (default: the owner the linker reports)")
	f.DurationVar(&k.serverInfoTimeout, "kvcr-server-info-timeout", 10*time.Second, "kvcr: bound on reading the engine's /get_server_info (its topology and inventory descriptor)")
	f.IntVar(&k.topo.TP, "tp", 1, "engine topology: tensor-parallel size (--kvcr-inventory: 1 only)")
	f.IntVar(&k.dp, "dp", 1, "engine topology: data-parallel size, an alias of --dp-size (--kvcr-inventory: 1 only)")
	f.IntVar(&k.topo.PP, "pp", 1, "engine topology: pipeline-parallel size (--kvcr-inventory: 1 only)")
	f.BoolVar(&k.topo.AttentionDP, "attention-dp", false, "engine topology: attention data parallel (SGLang --enable-dp-attention; refused with --kvcr-inventory)")
	f.IntVar(&k.topo.CP, "context-parallel", 1, "engine topology: context-parallel size (--kvcr-inventory: 1 only)")
	f.IntVar(&k.topo.DCP, "dcp", 1, "engine topology: decode-context-parallel size (--kvcr-inventory: 1 only)")
	f.IntVar(&k.topo.NNodes, "nnodes", 1, "engine topology: nodes the engine spans (--kvcr-inventory: 1 only)")
	f.IntVar(&k.topo.TokenizerWorkers, "tokenizer-workers", 1, "engine topology: tokenizer worker processes (SGLang --tokenizer-worker-num; --kvcr-inventory: 1 only)")
}

// check validates the flags before anything starts: values, what needs
// what, the operator's KVCR config and endpoints (all or none), and the
// topology the flags describe. dpSize is --dp-size, reconciled with --dp.
func (k *kvcrFlags) check(fs *pflag.FlagSet, engineKind string, dpSize *int, peers []string) error {
	if err := checkInts(intFlag{"tp", int64(k.topo.TP), 1}, intFlag{"dp", int64(k.dp), 1}, intFlag{"pp", int64(k.topo.PP), 1},
		intFlag{"context-parallel", int64(k.topo.CP), 1}, intFlag{"dcp", int64(k.topo.DCP), 1}, intFlag{"nnodes", int64(k.topo.NNodes), 1},
		intFlag{"tokenizer-workers", int64(k.topo.TokenizerWorkers), 1}); err != nil {
		return err
	}
	if fs.Changed("dp") {
		if fs.Changed("dp-size") && k.dp != *dpSize {
			return fmt.Errorf("--dp %d and --dp-size %d: one is an alias of the other, give one", k.dp, *dpSize)
		}
		*dpSize = k.dp
	}
	k.topo.DP = *dpSize
	if !k.on {
		for _, name := range []string{"kvcr-inventory-endpoint", "kvcr-inventory-replay", "kvcr-extra-config", "kvcr-cache-owner"} {
			if fs.Changed(name) {
				return fmt.Errorf("--%s needs --kvcr-inventory", name)
			}
		}
		return nil
	}
	if engineKind == "sim" {
		return errors.New("--kvcr-inventory takes a real engine's KVCR linker inventory: give --engine sglang (or another real engine) and --engine-url")
	}
	if len(peers) > 0 {
		return errors.New("--kvcr-inventory and --peer-endpoint: with KVCR the endpoints are the linker's (advertise_host and control_port in --kvcr-extra-config)")
	}
	if k.endpoint == "" {
		return errors.New("--kvcr-inventory needs --kvcr-inventory-endpoint: the linker's inventory publisher, tcp://HOST:PORT")
	}
	for _, ep := range []struct{ flag, v string }{{"kvcr-inventory-endpoint", k.endpoint}, {"kvcr-inventory-replay", k.replay}} {
		if ep.v == "" {
			continue
		}
		if _, err := kv.ParseEndpoint(ep.v); err != nil {
			return fmt.Errorf("--%s: %w", ep.flag, err)
		}
	}
	if k.serverInfoTimeout <= 0 {
		return fmt.Errorf("--kvcr-server-info-timeout %v: want > 0", k.serverInfoTimeout)
	}
	if err := k.topo.Gate("worker flags"); err != nil {
		return err
	}
	var err error
	if k.lc, err = kvcr.ParseLinkerConfig(k.extraConfig); err != nil {
		return err
	}
	if err := k.lc.Check(); err != nil {
		return err
	}
	if k.endpoints, err = k.lc.Endpoints(*dpSize); err != nil {
		return err
	}
	return nil
}

// hashDomain is the block-hash domain each engine kind's events use.
func hashDomain(engineKind string) string {
	switch engineKind {
	case "sglang":
		return kvcr.HashDomainSGLang
	case "vllm":
		return kvcr.HashDomainVLLM
	}
	return ""
}

// attach reads the engine's own account (/get_server_info): a topology it
// reports is gated like the flags' (a refusal is fatal), and its linker
// inventory descriptor, validated, gives the state agent. A missing or
// invalid descriptor is not fatal: the worker then advertises no KVCR
// endpoints, takes no hints and keeps serving (agent nil, reason logged).
func (k *kvcrFlags) attach(ctx context.Context, engineKind, url string, blockSize int, log *slog.Logger) (*kvcr.Agent, error) {
	ctx, cancel := context.WithTimeout(ctx, k.serverInfoTimeout)
	defer cancel()
	si, err := kvcr.FetchServerInfo(ctx, &http.Client{}, url)
	switch {
	case errors.Is(err, kvcr.ErrNoServerInfo):
		log.Warn("kvcr inventory off: the engine serves no /get_server_info, so it reports no linker inventory; no KVCR endpoints advertised, no hints taken", "engine_url", url)
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("--kvcr-inventory: reading the engine's %s: %w", kvcr.ServerInfoPath, err)
	}
	if err := si.Topology.Gate("the engine's " + kvcr.ServerInfoPath); err != nil {
		return nil, err
	}
	if si.Inventory == nil {
		log.Warn("kvcr inventory off: the engine reports no kvcr_inventory (linker inventory not published: check publish_inventory and the linker flags); no KVCR endpoints advertised, no hints taken")
		return nil, nil
	}
	a, err := kvcr.NewAgent(kvcr.AgentConfig{Endpoint: k.endpoint, ReplayEndpoint: k.replay, Descriptor: *si.Inventory,
		Expect: kvcr.Expect{BlockSize: blockSize, HashDomain: hashDomain(engineKind), CacheOwner: k.owner}, Logger: log})
	if err != nil {
		log.Warn("kvcr inventory off: the linker's inventory failed validation; no KVCR endpoints advertised, no hints taken", "err", err)
		return nil, nil
	}
	log.Info("kvcr inventory on", "cache_owner", a.Owner(), "topic", si.Inventory.Topic, "endpoints", k.endpoints)
	return a, nil
}

// registerKVCRMetrics exports the state agent's counters; capable is 1
// when the agent runs (inventory validated, endpoints advertised).
func registerKVCRMetrics(reg prometheus.Registerer, a *kvcr.Agent) error {
	capable := 0.0
	if a != nil {
		capable = 1
	}
	if err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_kvcr_inventory_capable",
		Help: "1 when the KVCR linker inventory validated and its endpoints are advertised, else 0."}, func() float64 { return capable })); err != nil {
		return err
	}
	if a == nil {
		return nil
	}
	for _, c := range []struct {
		name, help string
		v          func(kvcr.AgentStats) uint64
	}{
		{"events", "KV events taken from the KVCR linker's inventory.", func(s kvcr.AgentStats) uint64 { return s.Events }},
		{"epochs", "KVCR inventory resets: the linker cleared its inventory or its publisher restarted (one engine restart may count twice).", func(s kvcr.AgentStats) uint64 { return s.Epochs }},
		{"released_blocks", "Blocks the cache owner released at epoch changes.", func(s kvcr.AgentStats) uint64 { return s.Released }},
		{"unknown_media", "Inventory events dropped for a medium that names no tier.", func(s kvcr.AgentStats) uint64 { return s.UnknownMedia }},
		{"lost_batches", "Inventory batches lost beyond replay.", func(s kvcr.AgentStats) uint64 { return s.Lost }},
	} {
		if err := reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvmesh_kvcr_inventory_" + c.name + "_total", Help: c.help},
			func() float64 { return float64(c.v(a.Stats())) })); err != nil {
			return err
		}
	}
	return reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_kvcr_inventory_held_blocks",
		Help: "Blocks the KVCR cache owner holds now, over every tier."}, func() float64 { return float64(a.Stats().Held) }))
}
