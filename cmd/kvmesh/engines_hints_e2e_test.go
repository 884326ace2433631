package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/natsbus/natstest"
)

// kvcrConfigOn is KVCR's extra config with the linker's control port.
func kvcrConfigOn(port int) string {
	return strings.Replace(kvcrGoodConfig, `"control_port":23280`, fmt.Sprintf(`"control_port":%d`, port), 1)
}

// A KVCR worker is a hint source: two SGLang stand-ins with the KVCR
// linker, each behind a worker with --kvcr-inventory (its own control
// port), and a frontend. A shared prefix is served once, then its holder
// is loaded until the router sends an extension of it to the other
// engine: that request carries kv_hints naming the holder's linker
// endpoint (advertise_host:control_port from its KVCR config), mode copy.
func TestKVCRWorkerIsHintSource(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ns := natstest.Start(t)
	var mocks []*mockProc
	var endpoints []string
	for i, name := range []string{"mock A", "mock B"} {
		port := freePort(t)
		cfg := kvcrConfigOn(port)
		m := startMockSGLangKVCR(t, name, "--hicache-storage-backend-extra-config", cfg)
		startProc(t, fmt.Sprintf("worker %c", 'A'+i), m.workerArgs(ns.URL(), "--kvcr-extra-config", cfg, "--log-level", "warn")...).
			Expect(workerLine, 30*time.Second)
		mocks, endpoints = append(mocks, m.mockProc), append(endpoints, fmt.Sprintf("tcp://127.0.0.1:%d", port))
	}
	ws := watchWorkers(t, ns.URL(), "mock-model", 2)
	for _, in := range ws.watcher.Instances() {
		if len(in.ControlEndpoints) != 1 || in.AcceptsHints == nil || !*in.AcceptsHints {
			t.Fatalf("registration %+v: want the linker's endpoint and hints accepted", in)
		}
	}
	base := startFrontendProc(t, ns.URL())
	shared := tokenPrompt(20*16, 51000)
	if st, c := completeOnce(t, base, map[string]any{"model": "mock-model", "prompt": shared, "max_tokens": 1}); st != 200 {
		t.Fatalf("shared prompt: %d %+v", st, c)
	}
	hint, target, stop := awaitHint(t, base, mocks, shared)
	defer stop()
	var env struct {
		Actions []struct {
			ActionType string `json:"action_type"`
			Payload    struct {
				Source string `json:"source_control_endpoint"`
				Mode   string `json:"mode"`
			} `json:"payload"`
		} `json:"actions"`
	}
	if err := json.Unmarshal(hint.Envelope, &env); err != nil {
		t.Fatal(err)
	}
	src := endpoints[1-target]
	if hint.Field != "kv_hints" || len(env.Actions) != 1 || env.Actions[0].ActionType != "kv.fetch" ||
		env.Actions[0].Payload.Source != src || env.Actions[0].Payload.Mode != "copy" || len(hint.BlockHashes) == 0 {
		t.Fatalf("hint at mock %d: %+v %s\nwant kv_hints, one kv.fetch from %s, mode copy", target, hint, hint.Envelope, src)
	}
}
