package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

const kvcrGoodConfig = `{"publish_inventory":true,"kvcr_service_socket_path":null,"advertise_host":"127.0.0.1","control_port":23280}`

// kvcrWorkerArgs is a worker with --kvcr-inventory in front of an engine
// URL nothing serves: every refusal below must come before it is dialled.
func kvcrWorkerArgs(extra ...string) []string {
	return append([]string{"worker", "--nats", "nats://127.0.0.1:1", "--engine", "vllm", "--engine-url", "http://127.0.0.1:1",
		"--kvcr-inventory", "--kvcr-inventory-endpoint", "tcp://127.0.0.1:2", "--kvcr-extra-config", kvcrGoodConfig}, extra...)
}

// runExit1 runs the binary and wants exit status 1 with exactly want on
// stderr and nothing on stdout.
func runExit1(t *testing.T, bin string, args []string, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = os.Environ()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("%q: exit %v, want status 1; stderr %q", args, err, stderr.String())
		return
	}
	if stderr.String() != want {
		t.Errorf("%q: stderr %q\nwant %q", args, stderr.String(), want)
	}
	if stdout.Len() != 0 {
		t.Errorf("%q: printed %q on stdout", args, stdout.String())
	}
}

// Every topology linker inventory cannot describe is refused at start,
// from the worker's flags, with one line saying why; so are bad KVCR host
// settings, naming the option the operator sets.
func TestKVCRWorkerRefusals(t *testing.T) {
	bin := testutil.Binary(t)
	const gate = "kvmesh: --kvcr-inventory: unsupported engine topology (worker flags): "
	for _, c := range []struct {
		args []string
		want string
	}{
		{kvcrWorkerArgs("--tp", "2"), gate + "tensor parallel 2 (linker inventory is published at TP 1 only)\n"},
		{kvcrWorkerArgs("--dp-size", "2"), gate + "data parallel 2 (the inventory carries no DP rank)\n"},
		{kvcrWorkerArgs("--dp", "2"), gate + "data parallel 2 (the inventory carries no DP rank)\n"},
		{kvcrWorkerArgs("--attention-dp"), gate + "attention data parallel (ranks bind control ports the inventory does not name)\n"},
		{kvcrWorkerArgs("--context-parallel", "2"), gate + "context parallel 2 (each rank holds part of a block's KV)\n"},
		{kvcrWorkerArgs("--dcp", "2"), gate + "decode context parallel 2 (each rank holds part of a block's KV)\n"},
		{kvcrWorkerArgs("--pp", "2"), gate + "pipeline parallel 2 (each stage holds only its layers' KV)\n"},
		{kvcrWorkerArgs("--nnodes", "2"), gate + "2 nodes (one host's endpoint cannot serve a multi-node engine's blocks)\n"},
		{kvcrWorkerArgs("--tokenizer-workers", "2"), gate + "2 tokenizer workers (hints would reach only one of them)\n"},
		{kvcrWorkerArgs("--kvcr-extra-config", `{"publish_inventory":true,"advertise_host":"0.0.0.0","control_port":23280}`),
			"kvmesh: advertise_host in --hicache-storage-backend-extra-config (and --kvcr-extra-config) \"0.0.0.0\" is a wildcard, which no peer can dial: give this host's reachable address\n"},
		{kvcrWorkerArgs("--kvcr-extra-config", `{"publish_inventory":true,"advertise_host":"::1:23280","control_port":23280}`),
			"kvmesh: advertise_host in --hicache-storage-backend-extra-config (and --kvcr-extra-config) \"::1:23280\" is not an IPv6 address (an IPv6 address with a port must be bracketed, [addr]:port, and advertise_host takes no port)\n"},
		{kvcrWorkerArgs("--kvcr-extra-config", `{"advertise_host":"127.0.0.1","control_port":23280}`),
			"kvmesh: publish_inventory in --hicache-storage-backend-extra-config (and --kvcr-extra-config) is not true: the linker publishes no inventory\n"},
		{kvcrWorkerArgs("--kvcr-inventory-endpoint", "tcp://::1:5557"),
			"kvmesh: --kvcr-inventory-endpoint: endpoint \"tcp://::1:5557\": IPv6 host must be bracketed, as in tcp://[::1]:9000\n"},
		{kvcrWorkerArgs("--dp", "1", "--dp-size", "2"), "kvmesh: --dp 1 and --dp-size 2: one is an alias of the other, give one\n"},
		{kvcrWorkerArgs("--tp", "0"), "kvmesh: --tp 0: want at least 1\n"},
		{[]string{"worker", "--nats", "nats://127.0.0.1:1", "--kvcr-inventory"},
			"kvmesh: --kvcr-inventory takes a real engine's KVCR linker inventory: give --engine sglang (or another real engine) and --engine-url\n"},
		{[]string{"worker", "--nats", "nats://127.0.0.1:1", "--kvcr-inventory-endpoint", "tcp://127.0.0.1:2"}, "kvmesh: --kvcr-inventory-endpoint needs --kvcr-inventory\n"},
	} {
		runExit1(t, bin, c.args, c.want)
	}
	// The same refusal through the environment, as a deployment sets it.
	t.Setenv("KVMESH_PP", "4")
	runExit1(t, bin, kvcrWorkerArgs(), gate+"pipeline parallel 4 (each stage holds only its layers' KV)\n")
}
