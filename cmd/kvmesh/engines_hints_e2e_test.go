package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
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
		t.Fatalf("hint at mock %d in %s: %s\nwant kv_hints, one kv.fetch from %s, mode copy", target, hint.Field, hint.Envelope, src)
	}
}

// pdHintBurst runs serve --engine kind over two prefill stand-ins, each
// with a peer endpoint (a KV hint source), and one decode stand-in; after
// the shared prompt is served once, bursts of concurrent requests
// extending it go out until the router sends one to the other prefill
// engine with a hint (--router-temperature 1 samples the choice, so some
// go to the engine that lacks the prefix). Hints reach prefill legs (> 0) and never the
// decode leg (= 0).
func pdHintBurst(t *testing.T, kind string, start func(t *testing.T, name string, args ...string) *mockProc, preArgs, decArgs []string) {
	pre := []*mockProc{start(t, "prefill mock A", preArgs...), start(t, "prefill mock B", preArgs...)}
	dec := start(t, "decode mock", decArgs...)
	s := startServe(t, "--engine", kind, "--prefill-engine-url", pre[0].url+","+pre[1].url, "--prefill-kv-events", pre[0].events+","+pre[1].events,
		"--prefill-peer-endpoint", peerService(t)+","+peerService(t), "--decode-engine-url", dec.url, "--decode-kv-events", dec.events,
		"--disagg-local-prefill-tokens", "0", "--router-temperature", "1")
	defer s.stop(t)
	shared := tokenPrompt(24*16, 52000)
	if st, c := completeOnce(t, s.base, map[string]any{"model": "mock-model", "prompt": shared, "max_tokens": 2}); st != 200 {
		t.Fatalf("shared prompt: %d %+v", st, c)
	}
	hinted := func() int { return len(mockHints(t, pre[0])) + len(mockHints(t, pre[1])) }
	for round := 0; hinted() == 0 && round < 5; round++ {
		var wg sync.WaitGroup
		for i := range 48 {
			p := append(append([]uint32(nil), shared...), tokenPrompt(16, uint32(80000+1000*round+16*i))...)
			wg.Go(func() {
				resp, err := tryCompletion(context.Background(), s.base, map[string]any{"model": "mock-model", "prompt": p, "max_tokens": 2})
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		}
		wg.Wait()
	}
	if hinted() == 0 {
		t.Fatal("no hint reached a prefill leg")
	}
	if hs := mockHints(t, dec); len(hs) != 0 {
		t.Fatalf("%d hints reached the decode leg, the first from %s", len(hs), hs[0].SourceEndpoint)
	}
}

// vLLM P/D with two prefill workers that are hint sources.
func TestServeVLLMPDHintsOnPrefillLegsOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	pdHintBurst(t, "vllm", startMockVLLM, []string{"--kv-role", "kv_producer", "--side-channel-port", "0"},
		[]string{"--speedup-ratio", "0", "--kv-role", "kv_consumer", "--side-channel-port", "0"})
}

// SGLang P/D with two prefill workers that are hint sources.
func TestServeSGLangPDHintsOnPrefillLegsOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	pdHintBurst(t, "sglang", startMockSGLang, []string{"--disaggregation-mode", "prefill"},
		[]string{"--speedup-ratio", "0", "--disaggregation-mode", "decode"})
}
