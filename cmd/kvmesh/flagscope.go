package main

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/kvmesh/kvmesh/kv"
)

// A flag given where it has no effect is refused, naming it: a user who
// sets --kvbm-disk-dir for a TensorRT-LLM worker, or --blocks for a vLLM
// one, believes it applies. Which flag applies where is one table,
// flagScopes, read by worker and serve before anything starts. (Flags with
// a refusal of their own, such as --control-listen or serve's
// --engine-url lists, keep it.)

// flagUse is what decides whether a flag applies.
type flagUse struct {
	command string  // "worker" or "serve"
	engine  string  // --engine: sim or a real engine's kind
	role    kv.Role // worker: --role; serve: aggregated
	// connector is --connector ("" for none).
	connector string
	// prefillWorkers and decodeWorkers are serve's simulated P/D pools.
	prefillWorkers, decodeWorkers int
}

func (u flagUse) sim() bool { return u.engine == "sim" }

// flagScope is a group of flags and where they apply: applies is false
// where they have no effect, and why then says why.
type flagScope struct {
	command string // "": every command that has the flags
	flags   []string
	applies func(flagUse) bool
	why     func(flagUse) string
}

// kvbmTierFlags are the KV block manager flags beside the tiers' sizes:
// the sim's in-process KVBM and a real engine's connector sidecar read
// them alike.
var kvbmTierFlags = []string{"kvbm-disk-dir", "kvbm-host-bandwidth", "kvbm-disk-bandwidth", "kvbm-disk-filter-off",
	"kvbm-object-url", "kvbm-object-blocks", "kvbm-object-queue", "kvbm-object-bandwidth", "kvbm-recompute-per-token"}

var flagScopes = []flagScope{
	{flags: []string{"blocks", "max-batched-tokens", "max-seqs", "watermark", "speedup-ratio", "decode-speedup-ratio",
		"layers", "payload-size", "transfer-timeout"},
		applies: flagUse.sim,
		why: func(u flagUse) string {
			return fmt.Sprintf("a sim flag, no effect with --engine %s (the engine sizes and schedules itself)", u.engine)
		}},
	{command: "serve", flags: []string{"workers", "prefill-workers", "decode-workers", "lora"},
		applies: flagUse.sim,
		why: func(u flagUse) string {
			return fmt.Sprintf("simulated workers only; with --engine %s serve runs one worker per --engine-url (LoRA adapters: kvmesh worker --lora)", u.engine)
		}},
	{command: "worker", flags: []string{"disagg-handoff-ttl"},
		applies: func(u flagUse) bool { return u.sim() && u.role == kv.RolePrefill },
		why: func(u flagUse) string {
			if !u.sim() {
				return fmt.Sprintf("a sim flag, no effect with --engine %s (the engine keeps its own handoffs)", u.engine)
			}
			return "only a --role prefill worker pins handoff blocks"
		}},
	{command: "serve", flags: []string{"disagg-handoff-ttl"},
		applies: func(u flagUse) bool { return u.sim() && u.prefillWorkers > 0 },
		why: func(u flagUse) string {
			if !u.sim() {
				return fmt.Sprintf("a sim flag, no effect with --engine %s (the engine keeps its own handoffs)", u.engine)
			}
			return "only simulated prefill workers (--prefill-workers) pin handoff blocks"
		}},
	{flags: []string{"kv-events", "kv-events-replay", "peer-endpoint", "kv-events-topic", "hint-form", "engine-timeout", "engine-health-interval",
		"kv-transfer", "prefill-kv-events", "prefill-kv-events-replay", "prefill-peer-endpoint", "decode-kv-events", "decode-kv-events-replay"},
		applies: func(u flagUse) bool { return !u.sim() },
		why:     func(flagUse) string { return "a real engine's flag, no effect with --engine sim" }},
	{flags: []string{"kv-events-topic"},
		applies: func(u flagUse) bool { return !engineAdapters[u.engine].eventsAtEngineURL },
		why: func(u flagUse) string {
			return fmt.Sprintf("--engine %s's KV events are polled over HTTP, with no ZMQ topic", u.engine)
		}},
	{flags: []string{"kv-transfer"},
		applies: func(u flagUse) bool { return u.engine == "vllm" && (u.command == "serve" || u.role == kv.RolePrefill) },
		why: func(u flagUse) string {
			if u.engine != "vllm" {
				return fmt.Sprintf("a vLLM flag: --engine %s's prefill answers always carry the connector's parameters", u.engine)
			}
			return "only a --role prefill worker's engine hands KV over"
		}},
	{command: "serve", flags: []string{"connector"},
		applies: func(u flagUse) bool { return u.decodeWorkers == 0 },
		why: func(flagUse) string {
			return "decode workers run no connector (their prompt KV comes from their prefill peers) and serve would start them without it; run kvbm on prefill workers with kvmesh worker --role prefill --connector kvbm"
		}},
	{flags: append([]string{"kvbm-host-blocks", "kvbm-disk-blocks", "kvbm-socket", "kvbm-staging-blocks"}, kvbmTierFlags...),
		applies: func(u flagUse) bool { return u.connector != "" },
		why:     func(flagUse) string { return "needs --connector kvbm" }},
	{command: "worker", flags: []string{"kvbm-socket", "kvbm-staging-blocks"},
		applies: func(u flagUse) bool { return !u.sim() },
		why: func(flagUse) string {
			return "a real engine's connector sidecar flag; the sim runs its KV block manager in-process"
		}},
}

// refuseIgnoredFlags returns an error naming the first flag given on the
// command line (or in its KVMESH_* variable) that has no effect for u.
func refuseIgnoredFlags(fs *pflag.FlagSet, u flagUse) error {
	for _, s := range flagScopes {
		if s.command != "" && s.command != u.command || s.applies(u) {
			continue
		}
		for _, name := range s.flags {
			if fs.Lookup(name) != nil && fs.Changed(name) {
				return fmt.Errorf("--%s: %s", name, s.why(u))
			}
		}
	}
	return nil
}
