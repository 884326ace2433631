package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus/natstest"
)

// A real CPU vLLM serving a LoRA adapter (random weights, rank 8 on the
// tiny model's q and v projections) behind `kvmesh worker --lora` and a
// frontend: the adapter's blocks come back in the engine's events under
// its lora_name, kvmesh indexes them in the adapter's hash domain (the
// router predicts exactly what vLLM reports cached for the adapter, and
// nothing for the base model on the same prompt), and the worker's
// inventory names the adapter on every block vLLM stored for it.
func TestRealVLLMLoRA(t *testing.T) {
	py := vllmPython(t)
	model := tinyModel(t)
	const adapter = "tiny-lora"
	dir := filepath.Join(t.TempDir(), adapter)
	writeTinyLoRA(t, dir, 8)
	v := startRealVLLM(t, py, model, "vllm LoRA", "--max-model-len", "1024", "--enable-lora", "--max-lora-rank", "8",
		"--lora-modules", adapter+"="+dir)
	v.ready(t, 12*time.Minute)

	ns := natstest.Start(t)
	w := startProc(t, "worker", "worker", "--engine", "vllm", "--engine-url", v.url, "--kv-events", v.events, "--kv-events-replay", v.replay,
		"--model", realModel, "--lora", adapter, "--block-size", "32", "--nats", ns.URL(), "--log-level", "warn")
	w.Expect(workerLine, 60*time.Second)
	fe := startProc(t, "frontend", "frontend", "--nats", ns.URL(), "--model", realModel, "--tokenizer", model, "--listen", "127.0.0.1:0",
		"--log-level", "warn")
	base := fe.Expect(frontendLine, 30*time.Second)[1]
	testutil.WaitFor(t, 20*time.Second, "the frontend listing the adapter", func() bool {
		var models struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		getJSON(t, base+"/models", &models)
		for _, m := range models.Data {
			if m.ID == adapter {
				return true
			}
		}
		return false
	})
	feMetrics := base[:len(base)-len("/v1")] + "/metrics"
	ws := watchWorkers(t, ns.URL(), realModel, 1)
	if in := ws.watcher.Instances(); len(in) != 1 || !slices.Contains(in[0].LoRAs, adapter) {
		t.Fatalf("registrations %+v: want one naming %s", in, adapter)
	}

	cachedThrough := func(t *testing.T, model string, p []uint32) (engine, predicted int) {
		t.Helper()
		before := metricSum(t, feMetrics, "kvmesh_router_predicted_cached_tokens_total")
		st, c := completeOnce(t, base, map[string]any{"model": model, "prompt": p, "max_tokens": 2})
		if st != 200 || c.Usage.PromptTokensDetails == nil {
			t.Fatalf("%s through kvmesh: %d %+v", model, st, c)
		}
		return c.Usage.PromptTokensDetails.CachedTokens, int(metricSum(t, feMetrics, "kvmesh_router_predicted_cached_tokens_total") - before)
	}
	p := realPrompt(3*realBlock+4, 401)
	if got, pred := cachedThrough(t, adapter, p); got != 0 || pred != 0 {
		t.Fatalf("first %s request: vLLM cached %d, router predicted %d", adapter, got, pred)
	}
	// Events reach the router some time after the answer.
	var got, pred int
	testutil.WaitFor(t, 30*time.Second, "the adapter's repeat predicted as vLLM caches it", func() bool {
		got, pred = cachedThrough(t, adapter, p)
		return got == 3*realBlock && pred == got
	}, func() string {
		return fmt.Sprintf("vLLM cached %d, router predicted %d, want %d", got, pred, 3*realBlock)
	})
	// The base model hashes the same tokens in another domain.
	if got, pred := cachedThrough(t, realModel, p); got != 0 || pred != 0 {
		t.Fatalf("the base model on the adapter's prompt: vLLM cached %d, router predicted %d", got, pred)
	}

	// vLLM's own decoder reads both names from the events; the worker's
	// inventory holds the adapter's blocks under its name, chained as vLLM
	// chains them.
	truth := readVLLMHoldings(t, py, []*realVLLM{v})[0]
	if fmt.Sprint(truth.LoRAs) != fmt.Sprintf("[None %s]", adapter) {
		t.Fatalf("vLLM's events name LoRAs %v", truth.LoRAs)
	}
	held := inventoryAgainstVLLM(t, ws, truth.parentOf())
	// 3 blocks stored for the adapter, 3 for the base model.
	want := map[inventoryKey]int{{kv.TierDevice, adapter}: 3, {kv.TierDevice, ""}: 3}
	if fmt.Sprint(held) != fmt.Sprint(want) {
		t.Fatalf("the worker's inventory holds blocks %v, want %v (3 of %s, 3 of the base model)", held, want, adapter)
	}
}

// writeTinyLoRA writes a PEFT LoRA adapter of rank r for the tiny model
// (scripts/vllm-tiny-model.sh: 2 layers, hidden 256) to dir: random A and
// B matrices on the q and v projections, float32 safetensors.
func writeTinyLoRA(t *testing.T, dir string, r int) {
	t.Helper()
	const hidden, layers = 256, 2
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.Marshal(map[string]any{"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": 2 * r, "lora_dropout": 0.0,
		"bias": "none", "target_modules": []string{"q_proj", "v_proj"}, "base_model_name_or_path": realModel, "inference_mode": true})
	if err := os.WriteFile(filepath.Join(dir, "adapter_config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	header := map[string]any{}
	var data []byte
	for l := range layers {
		for _, m := range []string{"q_proj", "v_proj"} {
			name := fmt.Sprintf("base_model.model.model.layers.%d.self_attn.%s", l, m)
			for _, x := range []struct {
				suffix string
				shape  [2]int
			}{{".lora_A.weight", [2]int{r, hidden}}, {".lora_B.weight", [2]int{hidden, r}}} {
				start := len(data)
				for range x.shape[0] * x.shape[1] {
					data = binary.LittleEndian.AppendUint32(data, math.Float32bits(float32(rng.NormFloat64()*0.01)))
				}
				header[name+x.suffix] = map[string]any{"dtype": "F32", "shape": x.shape, "data_offsets": []int{start, len(data)}}
			}
		}
	}
	h, _ := json.Marshal(header)
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	out = append(append(out, h...), data...)
	if err := os.WriteFile(filepath.Join(dir, "adapter_model.safetensors"), out, 0o644); err != nil {
		t.Fatal(err)
	}
}
