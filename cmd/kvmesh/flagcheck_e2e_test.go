package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// A bad flag value makes every command exit 1 at once with one line on
// stderr naming the flag, before it binds a port, starts NATS or reads a
// trace; zero sizes no longer fall back to package defaults silently. A
// mistyped subcommand of bench, events or hints fails too (it printed the
// help and exited 0).
func TestBadFlagsExitEarly(t *testing.T) {
	const trace = "../../twin/testdata/conversation_300.jsonl"
	bin := testutil.Binary(t) // built before the per-command deadlines start
	empty := filepath.Join(t.TempDir(), "empty.jsonl")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	shortKey := filepath.Join(t.TempDir(), "short-keys")
	dupHint := filepath.Join(t.TempDir(), "dup-hint.json")
	if err := os.WriteFile(shortKey, []byte("sk-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dupHint, []byte(`{"protocol_version":"0.1","message_id":"a","message_id":"b","actions":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// --listen on a port no test binds: a command that wrongly starts would
	// print its banner and hang until the timeout below.
	serve := []string{"serve", "--listen", "127.0.0.1:0", "--nats", "nats://127.0.0.1:1"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{append(serve, "--blocks", "0"), "kvmesh: --blocks 0: want at least 1\n"},
		{append(serve, "--block-size", "0"), "kvmesh: --block-size 0: want at least 1\n"},
		{append(serve, "--max-seqs", "-1"), "kvmesh: --max-seqs -1: want at least 1\n"},
		{append(serve, "--max-batched-tokens", "0"), "kvmesh: --max-batched-tokens 0: want at least 1\n"},
		{append(serve, "--max-body-bytes", "0"), "kvmesh: --max-body-bytes 0: want at least 1\n"},
		{append(serve, "--migration-limit", "-1"), "kvmesh: --migration-limit -1: want at least 0\n"},
		{append(serve, "--router-temperature", "-1"), "kvmesh: --router-temperature -1: want a finite number ≥ 0 (0: always the cheapest)\n"},
		{append(serve, "--stall-timeout", "-1s"), "kvmesh: --stall-timeout -1s: want ≥ 0 (0: off)\n"},
		{append(serve, "--speedup-ratio", "-1"), "kvmesh: --speedup-ratio -1: want a finite number ≥ 0 (0: no waiting)\n"},
		{append(serve, "--prefill-workers", "2"), "kvmesh: --prefill-workers 2 --decode-workers 0: disaggregated serving needs both\n"},
		{append(serve, "--decode-workers", "-1"), "kvmesh: --decode-workers -1: want at least 0\n"},
		{append(serve, "--disagg-local-prefill-ratio", "1.5"), "kvmesh: --disagg-local-prefill-ratio 1.5: want a fraction in (0, 1]\n"},
		{append(serve, "--disagg-local-prefill-tokens", "-1"), "kvmesh: --disagg-local-prefill-tokens -1: want ≥ 0 (0: never for length)\n"},
		{append(serve, "--prefill-workers", "1", "--decode-workers", "1", "--disagg-handoff-ttl", "0s"), "kvmesh: --disagg-handoff-ttl 0s: want > 0\n"},
		{[]string{"frontend", "--listen", "127.0.0.1:0", "--nats", "nats://127.0.0.1:1", "--disagg-local-prefill-ratio", "0"}, "kvmesh: --disagg-local-prefill-ratio 0: want a fraction in (0, 1]\n"},
		{[]string{"worker", "--nats", "nats://127.0.0.1:1", "--role", "prefill"}, "kvmesh: --role prefill needs --control-listen (and --advertise-host): decode workers pull the prompt's KV from it\n"},
		{[]string{"frontend", "--listen", "127.0.0.1:0", "--nats", "nats://127.0.0.1:1", "--max-body-bytes", "-5"}, "kvmesh: --max-body-bytes -5: want at least 1\n"},
		{[]string{"worker", "--nats", "nats://127.0.0.1:1", "--blocks", "0"}, "kvmesh: --blocks 0: want at least 1\n"},
		{[]string{"worker", "--nats", "nats://127.0.0.1:1", "--decode-speedup-ratio", "0"}, "kvmesh: --decode-speedup-ratio 0: want a finite number > 0\n"},
		{[]string{"worker", "--nats", "nats://127.0.0.1:1", "--advertise-host", "127.0.0.1"}, "kvmesh: --advertise-host names the host peers dial for --control-listen; without it nothing is advertised\n"},
		{[]string{"worker", "--nats", "nats://127.0.0.1:1", "--control-listen", "127.0.0.1:0", "--advertise-host", "my_host"}, "kvmesh: --advertise-host: hostname \"my_host\": invalid character '_'\n"},
		{[]string{"worker", "--nats", "nats://127.0.0.1:1", "--control-endpoints", "tcp://my_host:9000"}, "kvmesh: --control-endpoints (rank 0): endpoint \"tcp://my_host:9000\": hostname \"my_host\": invalid character '_'\n"},
		{append(serve, "--connector", "kvbm", "--kvbm-disk-blocks", "8"), "kvmesh: --kvbm-disk-blocks 8: give --kvbm-disk-dir\n"},
		{[]string{"worker", "--nats", "nats://127.0.0.1:1", "--role", "decode", "--connector", "kvbm", "--kvbm-host-blocks", "8"}, "kvmesh: --connector kvbm: a decode worker runs no connector (its prompt KV comes from its prefill peer); run kvbm on the prefill workers\n"},
		{append(serve, "--data-dir", "/nonexistent"), "kvmesh: --data-dir is the embedded NATS server's store; with --nats there is none\n"},
		{append(serve, "--nats-listen", "127.0.0.1:0"), "kvmesh: --nats-listen is the embedded NATS server's address; with --nats there is none\n"},
		{append(serve, "--nats-listen", "127.0.0.1:70000"), "kvmesh: --nats-listen \"127.0.0.1:70000\": port \"70000\", want 0 to 65535\n"},
		{append(serve, "--max-tokens-limit", "-1"), "kvmesh: --max-tokens-limit -1: want at least 0\n"},
		{append(serve, "--api-key-file", shortKey), "kvmesh: --api-key-file " + shortKey + ": an API key has 4 characters, want at least 16\n"},
		{[]string{"frontend", "--listen", "127.0.0.1:0", "--nats", "nats://127.0.0.1:1", "--admin-key-file", shortKey}, "kvmesh: --admin-key-file " + shortKey + ": an API key has 4 characters, want at least 16\n"},
		{append(serve, "--read-body-timeout", "-1s"), "kvmesh: --read-body-timeout -1s: want ≥ 0 (0: no limit)\n"},
		{[]string{"hints", "validate", dupHint}, "kvmesh: envelope: invalid object: duplicate key \"message_id\"\n"},
		{[]string{"events", "listen", "--endpoint", "tcp://127.0.0.1:1", "--count", "-1"}, "kvmesh: --count -1: want ≥ 0 (0: until the timeout or Ctrl-C)\n"},
		{[]string{"events", "listen", "--endpoint", "tcp://127.0.0.1:1", "--timeout", "-1s"}, "kvmesh: --timeout -1s: want ≥ 0 (0: wait forever)\n"},
		{[]string{"bench", "index", "--trace", trace, "--workers", "0"}, "kvmesh: bench index: --workers 0: want at least 1\n"},
		{[]string{"bench", "index", "--trace", trace, "--cache-blocks", "0"}, "kvmesh: bench index: --cache-blocks 0: want at least 1\n"},
		{[]string{"bench", "index", "--trace", trace, "--limit", "-1"}, "kvmesh: bench index: --limit -1: want at least 0\n"},
		{[]string{"bench", "index", "--trace", trace, "--offered-rates", "1000,0"}, "kvmesh: bench index: --offered-rates: 0 is not a rate in ops/s (want > 0)\n"},
		{[]string{"bench", "index", "--trace", trace, "--event-groups", "-1"}, "kvmesh: bench index: --event-groups -1: want at least 0\n"},
		{[]string{"bench", "index", "--trace", trace, "--find-threads", "5000"}, "kvmesh: bench index: --find-threads 5000: want at most 1024\n"},
		{[]string{"bench", "route", "--prompt-tokens", "0"}, "kvmesh: bench route: --prompt-tokens 0: want at least 1\n"},
		{[]string{"bench", "route", "--workers", "0"}, "kvmesh: bench route: --workers 0: want at least 1\n"},
		{[]string{"twin", "--trace", trace, "--requests", "-1"}, "kvmesh: twin: --requests -1, want ≥ 0\n"},
		{[]string{"twin", "--trace", trace, "--concurrency", "-1"}, "kvmesh: twin: --concurrency -1, want ≥ 0\n"},
		{[]string{"twin", "--trace", trace, "--temperature", "-1"}, "kvmesh: twin: --temperature -1, want a finite number ≥ 0\n"},
		{[]string{"twin", "--trace", trace, "--arrival-speedup", "0"}, "kvmesh: twin: --arrival-speedup 0, want a finite number > 0\n"},
		{[]string{"twin", "--trace", empty}, "kvmesh: twin: " + empty + " holds no valid requests (0 malformed lines skipped)\n"},
		{[]string{"hints", "validate", "--engine", "tgi", empty}, "kvmesh: --engine: unknown engine \"tgi\" (want vllm, vllm-bridge, sglang or trtllm)\n"},
		{[]string{"bench", "laod"}, "kvmesh: unknown command \"laod\" for \"kvmesh bench\"; did you mean \"load\"?\n"},
		{[]string{"events", "nope"}, "kvmesh: unknown command \"nope\" for \"kvmesh events\"\n"},
		{[]string{"hints", "vaildate", empty}, "kvmesh: unknown command \"vaildate\" for \"kvmesh hints\"; did you mean \"validate\"?\n"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cmd := exec.CommandContext(ctx, bin, c.args...)
		cmd.Env = append(os.Environ(), "KVMESH_TRACE=")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		cancel()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Errorf("%q: exit %v, want status 1; stderr %q", c.args, err, stderr.String())
			continue
		}
		if stderr.String() != c.want {
			t.Errorf("%q: stderr %q\nwant %q", c.args, stderr.String(), c.want)
		}
		if stdout.Len() != 0 {
			t.Errorf("%q: printed %q on stdout", c.args, stdout.String())
		}
	}
}

// A bad OpenTelemetry variable stops serve, frontend and worker at once,
// naming the variable, like a bad flag.
func TestBadOTELEnvExitsEarly(t *testing.T) {
	bin := testutil.Binary(t)
	nats := []string{"--nats", "nats://127.0.0.1:1"}
	for _, c := range []struct {
		args []string
		env  string
		want string
	}{
		{append([]string{"serve", "--listen", "127.0.0.1:0"}, nats...), "OTEL_TRACES_EXPORTER=zipkin",
			"kvmesh: OTEL_TRACES_EXPORTER: \"zipkin\" is not supported (otlp or none)\n"},
		{append([]string{"frontend", "--listen", "127.0.0.1:0"}, nats...), "OTEL_TRACES_EXPORTER=otlp OTEL_EXPORTER_OTLP_PROTOCOL=http/json",
			"kvmesh: OTEL_EXPORTER_OTLP_PROTOCOL: \"http/json\" is not supported (http/protobuf or grpc)\n"},
		{append([]string{"worker"}, nats...), "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=thrift",
			"kvmesh: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: \"thrift\" is not supported (http/protobuf or grpc)\n"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cmd := exec.CommandContext(ctx, bin, c.args...)
		cmd.Env = append(os.Environ(), strings.Fields(c.env)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		cancel()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || stderr.String() != c.want {
			t.Errorf("%s %q: exit %v, stderr %q\nwant status 1 and %q", c.env, c.args, err, stderr.String(), c.want)
		}
	}
}

// A twin mode in which every request is rejected (each needs more blocks
// than a worker has) prints its rejections but exits non-zero: a table of
// zeros is not a measurement.
func TestTwinFailsWhenNothingCompletes(t *testing.T) {
	t.Setenv("KVMESH_TRACE", "")
	out, _, err := runTwinCmd(t, "--trace", "../../twin/testdata/conversation_300.jsonl", "--requests", "5", "--workers", "2", "--blocks", "1")
	if err == nil || err.Error() != "twin: mode kv completed none of its 5 requests (all rejected; see above)" {
		t.Fatalf("err %v", err)
	}
	if !bytes.Contains([]byte(out), []byte("0/5 requests completed, 5 rejected")) {
		t.Errorf("summary does not show the rejections:\n%s", out)
	}
}
