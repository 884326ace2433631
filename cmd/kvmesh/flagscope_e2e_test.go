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
	const trtWhy = ": no effect with --engine trtllm: the engine runs its own connector, which kvmesh sizes by --kvbm-host-blocks and --kvbm-disk-blocks only\n"
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
		{with(trtKVBM, "--kvbm-disk-dir", "/tmp/kvbm"), "kvmesh: --kvbm-disk-dir" + trtWhy},
		{with(trtKVBM, "--kvbm-host-bandwidth", "1e9"), "kvmesh: --kvbm-host-bandwidth" + trtWhy},
		{with(trtKVBM, "--kvbm-disk-bandwidth", "1e9"), "kvmesh: --kvbm-disk-bandwidth" + trtWhy},
		{with(trtKVBM, "--kvbm-disk-filter-off"), "kvmesh: --kvbm-disk-filter-off" + trtWhy},
		// No probe of the bucket: the answer comes at once, with no credentials.
		{with(trtKVBM, "--kvbm-object-url", "s3://kvmesh-no-such-bucket?region=us-east-1", "--kvbm-object-blocks", "8"), "kvmesh: --kvbm-object-url" + trtWhy},
		{with(trtKVBM, "--kvbm-object-blocks", "8"), "kvmesh: --kvbm-object-blocks" + trtWhy},
		{with(trtKVBM, "--kvbm-object-queue", "4"), "kvmesh: --kvbm-object-queue" + trtWhy},
		{with(trtKVBM, "--kvbm-object-bandwidth", "1e9"), "kvmesh: --kvbm-object-bandwidth" + trtWhy},
		{with(trtKVBM, "--kvbm-recompute-per-token", "20us"), "kvmesh: --kvbm-recompute-per-token" + trtWhy},
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
