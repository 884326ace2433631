package main

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// Every flag given where it has no effect stops the command at once with
// exit status 1 and one line naming it (flagScopes), before any engine is
// attached or bucket probed: the URLs here answer nothing, so a command
// that went on would fail differently or hang.
func TestIgnoredFlagsRefused(t *testing.T) {
	bin := testutil.Binary(t)
	nats := []string{"--nats", "nats://127.0.0.1:1"}
	trtKVBM := append([]string{"worker", "--engine", "trtllm", "--engine-url", "http://127.0.0.1:1", "--connector", "kvbm", "--kvbm-host-blocks", "8"}, nats...)
	serve := []string{"serve", "--listen", "127.0.0.1:0", "--nats", "nats://127.0.0.1:1"}
	vllmServe := with(serve, "--engine", "vllm", "--engine-url", "http://127.0.0.1:1")
	simWorker := append([]string{"worker"}, nats...)
	cases := []struct {
		args []string
		want string
	}{
		{with(simWorker, "--engine", "vllm", "--engine-url", "http://127.0.0.1:1", "--blocks", "64"),
			"kvmesh: --blocks: a sim flag, no effect with --engine vllm (the engine sizes and schedules itself)\n"},
		{with(simWorker, "--engine", "sglang", "--engine-url", "http://127.0.0.1:1", "--speedup-ratio", "2"),
			"kvmesh: --speedup-ratio: a sim flag, no effect with --engine sglang (the engine sizes and schedules itself)\n"},
		{with(simWorker, "--engine", "vllm", "--engine-url", "http://127.0.0.1:1", "--role", "prefill", "--disagg-handoff-ttl", "5s"),
			"kvmesh: --disagg-handoff-ttl: a sim flag, no effect with --engine vllm (the engine keeps its own handoffs)\n"},
		{with(simWorker, "--disagg-handoff-ttl", "5s"), "kvmesh: --disagg-handoff-ttl: only a --role prefill worker pins handoff blocks\n"},
		{with(simWorker, "--kv-events", "tcp://127.0.0.1:5557"), "kvmesh: --kv-events: a real engine's flag, no effect with --engine sim\n"},
		{with(simWorker, "--hint-form", "off"), "kvmesh: --hint-form: a real engine's flag, no effect with --engine sim\n"},
		{with(simWorker, "--engine", "trtllm", "--engine-url", "http://127.0.0.1:1", "--kv-events-topic", "kv"),
			"kvmesh: --kv-events-topic: --engine trtllm's KV events are polled over HTTP, with no ZMQ topic\n"},
		{with(simWorker, "--kvbm-host-blocks", "8"), "kvmesh: --kvbm-host-blocks: needs --connector kvbm\n"},
		// A real engine's connector sidecar takes every tier flag, checked as the sim's are.
		{with(trtKVBM, "--kvbm-disk-blocks", "8"), "kvmesh: --kvbm-disk-blocks 8: give --kvbm-disk-dir\n"},
		{with(trtKVBM, "--kvbm-object-blocks", "8"), "kvmesh: --kvbm-object-blocks 8: give --kvbm-object-url\n"},
		{with(trtKVBM, "--kvbm-host-bandwidth", "0"), "kvmesh: --kvbm-host-bandwidth 0: want a finite non-zero number (negative: free)\n"},
		{with(trtKVBM, "--kvbm-recompute-per-token", "auto"),
			"kvmesh: --kvbm-recompute-per-token auto: the sim's prefill model; with --engine trtllm give the engine's prefill cost per token (e.g. 20us) or off\n"},
		{with(trtKVBM, "--kvbm-staging-blocks", "0"), "kvmesh: --kvbm-staging-blocks 0: want at least 1\n"},
		{with(simWorker, "--connector", "kvbm", "--kvbm-host-blocks", "8", "--kvbm-socket", "/tmp/x.sock"),
			"kvmesh: --kvbm-socket: a real engine's connector sidecar flag; the sim runs its KV block manager in-process\n"},
		{with(simWorker, "--kvbm-staging-blocks", "8"), "kvmesh: --kvbm-staging-blocks: needs --connector kvbm\n"},
		{with(serve, "--prefill-workers", "1", "--decode-workers", "1", "--connector", "kvbm", "--kvbm-host-blocks", "8"),
			"kvmesh: --connector: decode workers run no connector (their prompt KV comes from their prefill peers) and serve would start them without it; run kvbm on prefill workers with kvmesh worker --role prefill --connector kvbm\n"},
		{with(serve, "--disagg-handoff-ttl", "5s"),
			"kvmesh: --disagg-handoff-ttl: only simulated prefill workers (--prefill-workers) pin handoff blocks\n"},
		{with(serve, "--kv-events", "tcp://127.0.0.1:5557"), "kvmesh: --kv-events: a real engine's flag, no effect with --engine sim\n"},
		{with(vllmServe, "--workers", "2"),
			"kvmesh: --workers: simulated workers only; with --engine vllm serve runs one worker per --engine-url (LoRA adapters: kvmesh worker --lora)\n"},
		{with(vllmServe, "--lora", "a"),
			"kvmesh: --lora: simulated workers only; with --engine vllm serve runs one worker per --engine-url (LoRA adapters: kvmesh worker --lora)\n"},
		{with(vllmServe, "--max-seqs", "8"),
			"kvmesh: --max-seqs: a sim flag, no effect with --engine vllm (the engine sizes and schedules itself)\n"},
		{with(simWorker, "--kv-transfer", "shared-storage"), "kvmesh: --kv-transfer: a real engine's flag, no effect with --engine sim\n"},
		{with(simWorker, "--engine", "sglang", "--engine-url", "http://127.0.0.1:1", "--role", "prefill", "--kv-transfer", "shared-storage"),
			"kvmesh: --kv-transfer: a vLLM flag: --engine sglang's prefill answers always carry the connector's parameters\n"},
		{with(simWorker, "--engine", "vllm", "--engine-url", "http://127.0.0.1:1", "--role", "decode", "--kv-transfer", "shared-storage"),
			"kvmesh: --kv-transfer: only a --role prefill worker's engine hands KV over\n"},
		{with(simWorker, "--engine", "vllm", "--engine-url", "http://127.0.0.1:1", "--role", "prefill", "--kv-transfer", "nixl"),
			"kvmesh: --kv-transfer \"nixl\": want params or shared-storage\n"},
		{with(vllmServe, "--kv-transfer", "shared-storage"),
			"kvmesh: --kv-transfer: only prefill engines (--prefill-engine-url) hand KV over\n"},
		// Never blind: an explicit kv router with no event source stops.
		{with(vllmServe, "--router-mode", "kv"),
			"kvmesh: --router-mode kv: no engine relays KV events; give --kv-events (or --prefill-kv-events and --decode-kv-events), or --router-mode kv-approx\n"},
		{with(serve, "--engine", "trtllm", "--engine-url", "http://127.0.0.1:1", "--kv-events", "off", "--router-mode", "kv"),
			"kvmesh: --router-mode kv: no engine relays KV events; give --kv-events (or --prefill-kv-events and --decode-kv-events), or --router-mode kv-approx\n"},
	}
	// No AWS credentials: a probe of the s3:// bucket would fail slowly or differently.
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("KVMESH_TRACE", "")
	for _, c := range cases {
		runExit1(t, bin, c.args, c.want)
	}
}

// with is base and more in a new slice (base is shared by many cases).
func with(base []string, more ...string) []string {
	return append(append([]string(nil), base...), more...)
}
