package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus/natstest"
)

// realKVBMInstance names the test worker's arena file.
const realKVBMInstance = "00000000000c0b30"

// kvmesh's connector inside a real vLLM (CPU): a prompt's blocks are
// offloaded to the worker's host tier; with vLLM's own prefix cache reset,
// the same prompt is loaded back from the host tier: vLLM's cached_tokens
// and the sidecar's onboarded blocks agree, and the greedy continuation is
// the same as when vLLM computed the prompt (the loaded KV is the right
// bytes; the sidecar verified their checksums). Then the sidecar is killed
// and vLLM keeps serving.
func TestRealVLLMKVBMConnector(t *testing.T) {
	py := vllmPython(t)
	model := tinyModel(t)
	ns := natstest.Start(t)
	sock := filepath.Join(t.TempDir(), "kvbm.sock")
	t.Setenv("PYTHONPATH", pythonDir(t))
	t.Setenv("VLLM_SERVER_DEV_MODE", "1") // POST /reset_prefix_cache
	kvt := strings.TrimSpace(vllmConnectorJSON(&kvbmFlags{socket: sock}, kv.RoleAggregated))
	v := startRealVLLM(t, py, model, "vllm", "--kv-transfer-config", kvt)
	t.Cleanup(func() {
		// The engine core's own error comes long before the log's tail.
		if b, err := os.ReadFile(v.log); t.Failed() && err == nil {
			if i := bytes.Index(b, []byte("Traceback")); i >= 0 {
				t.Logf("vllm's first traceback:\n%s", b[i:min(len(b), i+12<<10)])
			}
		}
	})
	mport := freePort(t)
	metrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", mport)
	w := startProc(t, "worker", "worker", "--engine", "vllm", "--engine-url", v.url, "--kv-events", v.events, "--kv-events-replay", v.replay,
		"--nats", ns.URL(), "--connector", "kvbm", "--kvbm-host-blocks", "256", "--kvbm-socket", sock, "--instance-id", realKVBMInstance,
		"--metrics-listen", fmt.Sprintf("127.0.0.1:%d", mport), "--engine-timeout", "300s", "--log-level", "info")
	v.ready(t, 5*time.Minute)
	w.Expect(workerLine, 60*time.Second)

	prompt := realPrompt(5*realBlock+7, 3)
	cached := func() (int, []uint32) {
		t.Helper()
		var c struct {
			Choices []struct {
				TokenIDs []uint32 `json:"token_ids"`
			} `json:"choices"`
			Usage struct {
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if st := postJSON(t, v.url+"/v1/completions", map[string]any{"model": realModel, "prompt": prompt, "max_tokens": 6,
			"temperature": 0, "ignore_eos": true, "return_token_ids": true}, &c); st != 200 || len(c.Choices) == 0 {
			t.Fatalf("completion: %d %+v", st, c)
		}
		return c.Usage.PromptTokensDetails.CachedTokens, c.Choices[0].TokenIDs
	}
	n0, first := cached()
	if n0 != 0 {
		t.Fatalf("a new prompt had %d cached tokens", n0)
	}
	if off := metricSum(t, metrics, "kvmesh_kvbm_offloaded_host_blocks_total"); off != 5 {
		t.Fatalf("%v blocks offloaded to the host tier, want the prompt's 5 full blocks", off)
	}
	if st := postJSON(t, v.url+"/reset_prefix_cache", map[string]any{}, nil); st != 200 {
		t.Fatalf("reset_prefix_cache: %d", st)
	}
	n1, again := cached()
	on := metricSum(t, metrics, "kvmesh_kvbm_onboarded_host_blocks_total")
	if n1 == 0 || float64(n1) != on*realBlock {
		t.Fatalf("vLLM cached %d tokens, the sidecar onboarded %v blocks of %d", n1, on, realBlock)
	}
	t.Logf("after vLLM's prefix cache reset: vLLM cached %d tokens, the sidecar onboarded %v host blocks", n1, on)
	if fmt.Sprint(first) != fmt.Sprint(again) {
		t.Fatalf("continuation %v after the host load, %v when computed", again, first)
	}
	if c := metricSum(t, metrics, "kvmesh_kvbm_corrupt_blocks_total"); c != 0 {
		t.Fatalf("%v corrupt blocks", c)
	}
	// The connector registered its pieces (each layer's K and V): the
	// blocks went through staging slots laid out piece by piece (arena
	// version 2).
	if arenas, _ := filepath.Glob("/dev/shm/kvmesh-kvbm-" + realKVBMInstance + "-*.arena"); len(arenas) != 1 {
		t.Fatalf("arena files %v, want one", arenas)
	} else if b, err := readHead(arenas[0], 64); err != nil {
		t.Fatalf("arena %s: %v", arenas[0], err)
	} else if ver, n := binary.LittleEndian.Uint64(b[8:]), binary.LittleEndian.Uint64(b[56:]); ver != 2 || n == 0 {
		t.Fatalf("arena version %d with %d pieces, want the piece layout", ver, n)
	} else {
		t.Logf("arena version %d: %d pieces a block, staging %d bytes past a page", ver, n, binary.LittleEndian.Uint64(b[48:])%4096)
	}
	// The sidecar dies; vLLM serves on (each connector call times out or
	// fails fast, and its loads are recomputed).
	w.Kill()
	// A killed worker cannot remove its arena (the next of its instance would).
	arenas, _ := filepath.Glob("/dev/shm/kvmesh-kvbm-" + realKVBMInstance + "-*.arena")
	for _, a := range arenas {
		os.Remove(a)
	}
	if st, ids := greedyIDs(t, v.url, realPrompt(3*realBlock, 9), nil); st != 200 || len(ids) == 0 {
		t.Fatalf("after the sidecar died: %d %v", st, ids)
	}
	if st, ids := greedyIDs(t, v.url, prompt, nil); st != 200 || fmt.Sprint(ids) != fmt.Sprint(first) {
		t.Fatalf("the prompt after the sidecar died: %d %v, want %v", st, ids, first)
	}
}

// readHead reads a file's first n bytes.
func readHead(path string, n int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, n)
	_, err = io.ReadFull(f, b)
	return b, err
}
