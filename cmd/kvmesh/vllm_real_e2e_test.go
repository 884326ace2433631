package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/hints"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
)

// `kvmesh serve --engine vllm` in front of two real `vllm serve` (the CPU
// build, a tiny Llama with random weights, the repo's tiny tokenizer on
// both sides). The engines start once and serve every subtest, in order:
// what the engine reports (model, max_model_len), tokenization alike on
// both sides, prefix affinity with vLLM's own cached_tokens equal to the
// router's prediction, the router's index equal to what vLLM's own
// decoder reads from the engines' events (hashes, parents, medium, LoRA),
// replay of what an engine stored while no kvmesh listened, what vLLM
// does with kvmesh's KV hint forms, and /health polling taking a stopped
// engine out and back in.
func TestRealVLLM(t *testing.T) {
	py := vllmPython(t)
	model := tinyModel(t)
	vs := startRealVLLMs(t, py, model, []string{"--max-model-len", "1024"}, []string{"--max-model-len", "768"})
	a, b := vs[0], vs[1]

	// Stored on A before any kvmesh subscribes: only replay brings it.
	early := realPrompt(5*realBlock+3, 1)
	if st, _ := greedyIDs(t, a.url, early, nil); st != 200 {
		t.Fatalf("early prompt straight to vLLM A: %d", st)
	}
	startKVMesh := func() *served {
		return startServe(t, "--engine", "vllm", "--engine-url", a.url+","+b.url, "--kv-events", a.events+","+b.events,
			"--kv-events-replay", a.replay+","+b.replay, "--block-size", strconv.Itoa(realBlock), "--tokenizer", model, "--engine-health-interval", "300ms",
			"--router-temperature", "0", "--admin-key-file", adminKeyArgs(t)[1])
	}
	s := startKVMesh()
	defer func() { s.stop(t) }()
	feMetrics := func() string { return strings.TrimSuffix(s.base, "/v1") + "/metrics" }

	t.Run("engine config", func(t *testing.T) {
		var models struct {
			Data []struct {
				ID          string `json:"id"`
				MaxModelLen int    `json:"max_model_len"`
			} `json:"data"`
		}
		getJSON(t, s.base+"/models", &models)
		if len(models.Data) != 1 || models.Data[0].ID != realModel || models.Data[0].MaxModelLen != 768 {
			t.Fatalf("/v1/models %+v: want %s with max_model_len 768, the smaller engine's", models, realModel)
		}
		ws := watchWorkers(t, s.natsURL, realModel, 2)
		for _, in := range ws.watcher.Instances() {
			if in.BlockSize != realBlock || (in.MaxModelLen != 1024 && in.MaxModelLen != 768) {
				t.Fatalf("registration %+v: want vLLM's block size 32 and its max_model_len", in)
			}
		}
		// Longer than the smaller engine takes: the frontend's 400.
		st, c := completeOnce(t, s.base, map[string]any{"model": realModel, "prompt": realPrompt(760, 2), "max_tokens": 20})
		if st != 400 || c.Error == nil || !strings.Contains(c.Error.Message, "maximum context length is 768") {
			t.Fatalf("780 tokens: %d %+v", st, c.Error)
		}
	})

	t.Run("tokenizer alike", func(t *testing.T) {
		msgs := []map[string]string{{"role": "user", "content": "Prefix caching, in front of a real engine."}}
		var tok struct {
			Tokens []uint32 `json:"tokens"`
		}
		if st := postJSON(t, a.url+"/tokenize", map[string]any{"model": realModel, "messages": msgs, "add_generation_prompt": true}, &tok); st != 200 {
			t.Fatalf("vLLM /tokenize: %d", st)
		}
		var chat struct {
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if st := postJSON(t, s.base+"/chat/completions", map[string]any{"model": realModel, "messages": msgs, "max_tokens": 2}, &chat); st != 200 {
			t.Fatalf("chat through kvmesh: %d", st)
		}
		// vLLM counts the ids kvmesh sent: the same count as its own
		// template and tokenizer make of the messages.
		if chat.Usage.PromptTokens != len(tok.Tokens) || len(tok.Tokens) < 20 {
			t.Fatalf("kvmesh sent %d prompt tokens, vLLM tokenizes the chat to %d", chat.Usage.PromptTokens, len(tok.Tokens))
		}
	})

	// cachedThrough sends p through kvmesh; it returns vLLM's cached_tokens
	// and the router's predicted cached tokens for it.
	cachedThrough := func(t *testing.T, p []uint32) (engine, predicted int) {
		t.Helper()
		before := metricSum(t, feMetrics(), "kvmesh_router_predicted_cached_tokens_total")
		st, c := completeOnce(t, s.base, map[string]any{"model": realModel, "prompt": p, "max_tokens": 2})
		if st != 200 || c.Usage.PromptTokensDetails == nil {
			t.Fatalf("through kvmesh: %d %+v", st, c)
		}
		return c.Usage.PromptTokensDetails.CachedTokens, int(metricSum(t, feMetrics(), "kvmesh_router_predicted_cached_tokens_total") - before)
	}
	// awaitCached waits until p's full blocks are cached and predicted:
	// events reach the router some time after the answer.
	awaitCached := func(t *testing.T, p []uint32, what string) {
		t.Helper()
		want := len(p) / realBlock * realBlock
		var got, pred int
		testutil.WaitFor(t, 30*time.Second, what, func() bool {
			got, pred = cachedThrough(t, p)
			return got == want && pred == want
		}, func() string { return fmt.Sprintf("vLLM cached %d, router predicted %d, want %d", got, pred, want) })
	}

	t.Run("replay of events before kvmesh", func(t *testing.T) {
		// Before any prompt through kvmesh could put it on B: only the
		// replay socket tells the router what A stored.
		checkIndexAgainstVLLM(t, py, s, vs)
		awaitCached(t, early, "the early prompt (stored before kvmesh listened) routed to vLLM A's cache")
	})

	t.Run("prefix affinity", func(t *testing.T) {
		// Both engines get new prompts (the router balances the load):
		// ties between idle engines go at random, so past four prompts
		// more are sent until each engine has computed one (all of twelve
		// to the same engine by chance: 1 in 4,096).
		bothComputed := func() bool {
			for _, v := range vs {
				if metricSum(t, v.url+"/metrics", "vllm:prompt_tokens_total") == 0 {
					return false
				}
			}
			return true
		}
		for i := 0; i < 4 || i < 12 && !bothComputed(); i++ {
			p := realPrompt(6*realBlock+5, uint64(100+i))
			if got, pred := cachedThrough(t, p); got != 0 || pred != 0 {
				t.Fatalf("new prompt %d: vLLM cached %d, router predicted %d", i, got, pred)
			}
			awaitCached(t, p, fmt.Sprintf("prompt %d's first repeat served from cache", i))
			// Once the router knows, every repeat lands on the holder and
			// vLLM's own count is the router's prediction.
			for r := range 3 {
				if got, pred := cachedThrough(t, p); got != 192 || pred != 192 {
					t.Fatalf("prompt %d repeat %d: vLLM cached %d, router predicted %d, want 192", i, r, got, pred)
				}
			}
		}
		for _, v := range vs {
			if n := metricSum(t, v.url+"/metrics", "vllm:prompt_tokens_total"); n == 0 {
				t.Errorf("%s computed no prompt", v.name)
			}
		}
	})

	t.Run("index equals the engines", func(t *testing.T) {
		checkIndexAgainstVLLM(t, py, s, vs)
	})

	t.Run("replay after a dropped subscription", func(t *testing.T) {
		s.stop(t)
		missed := realPrompt(4*realBlock+1, 7)
		if st, _ := greedyIDs(t, b.url, missed, nil); st != 200 {
			t.Fatalf("straight to vLLM B: %d", st)
		}
		s = startKVMesh()
		awaitCached(t, missed, "the prompt vLLM B stored while no kvmesh listened, routed to it")
		checkIndexAgainstVLLM(t, py, s, vs)
	})

	t.Run("kv hint forms", func(t *testing.T) {
		// vLLM's OpenAI server has no kv_hints field (its engine takes
		// hints only in-process): it ignores the native envelope and the
		// bridge's kv_transfer_params.kv_hint without a KV connector, and
		// serves the request as it would without.
		p := realPrompt(2*realBlock, 11)
		hint := json.RawMessage(hints.FromHint(&kv.Hint{ID: "sel-1", Endpoint: "tcp://127.0.0.1:9", Hashes: []kv.EngineHash{1, 2, 3}}).Marshal())
		_, plain := greedyIDs(t, a.url, p, nil)
		for _, form := range []map[string]any{
			{"kv_hints": hint},
			{"kv_transfer_params": map[string]any{hints.KeyKVHint: hint}},
		} {
			st, ids := greedyIDs(t, a.url, p, form)
			if st != 200 || !slices.Equal(ids, plain) || len(plain) != 6 {
				t.Fatalf("with %v: %d %v, without: %v", form, st, ids, plain)
			}
		}
		// A hint names a source worker with a KV peer service
		// (--peer-endpoint); without one no worker is a source, so the
		// default form never sends vLLM a hint at all.
		ws := watchWorkers(t, s.natsURL, realModel, 2)
		for _, in := range ws.watcher.Instances() {
			if len(in.ControlEndpoints) != 0 {
				t.Fatalf("registration %+v: a hint source without --peer-endpoint", in)
			}
		}
	})

	t.Run("health polling", func(t *testing.T) {
		ws := watchWorkers(t, s.natsURL, realModel, 2)
		b.signal(syscall.SIGSTOP)
		stopped := time.Now()
		defer b.signal(syscall.SIGCONT)
		testutil.WaitFor(t, 30*time.Second, "the stopped vLLM's worker out of discovery", func() bool { return len(ws.watcher.Instances()) == 1 })
		t.Logf("stopped vLLM out of discovery after %v", time.Since(stopped).Round(time.Millisecond))
		for i := range 3 {
			if st, c := completeOnce(t, s.base, map[string]any{"model": realModel, "prompt": realPrompt(40, uint64(200+i)), "max_tokens": 2}); st != 200 {
				t.Fatalf("with vLLM B stopped: %d %+v", st, c)
			}
		}
		b.signal(syscall.SIGCONT)
		testutil.WaitFor(t, 60*time.Second, "the resumed vLLM's worker back in discovery", func() bool { return len(ws.watcher.Instances()) == 2 })
	})
}

// checkIndexAgainstVLLM compares the router's index (/debug/kv-index)
// with what vLLM's own decoder reads from each engine's events, and each
// worker's inventory (its gRPC Dump) with the engine's parents, medium
// and LoRA names.
func checkIndexAgainstVLLM(t *testing.T, py string, s *served, vs []*realVLLM) {
	t.Helper()
	truth := readVLLMHoldings(t, py, vs)
	var want [][]kv.EngineHash
	for i, v := range vs {
		if len(truth[i].Held) == 0 && len(truth[i].Media) == 0 {
			continue // stored nothing yet (before any prompt reached it): nothing indexed
		}
		if len(truth[i].Held) != 1 || len(truth[i].Held["GPU"]) == 0 || fmt.Sprint(truth[i].Media) != "[GPU]" || fmt.Sprint(truth[i].LoRAs) != "[None]" {
			t.Fatalf("%s: vLLM's events say media %v, LoRAs %v, held %d media", v.name, truth[i].Media, truth[i].LoRAs, len(truth[i].Held))
		}
		hs := make([]kv.EngineHash, 0, len(truth[i].Held["GPU"]))
		for _, h := range truth[i].Held["GPU"] {
			hs = append(hs, kv.EngineHash(h))
		}
		want = append(want, hs)
	}
	if len(want) == 0 {
		t.Fatal("no engine stored a block: nothing to compare")
	}
	key := func(hs []kv.EngineHash) string { return fmt.Sprint(hs) }
	var got [][]kv.EngineHash
	testutil.WaitFor(t, 20*time.Second, "the router's index equal to the engines' events", func() bool {
		got = got[:0]
		for _, hs := range kvIndexView(t, s.base) {
			if len(hs) > 0 {
				got = append(got, hs)
			}
		}
		gk, wk := make([]string, 0, len(got)), make([]string, 0, len(want))
		for _, hs := range got {
			gk = append(gk, key(hs))
		}
		for _, hs := range want {
			wk = append(wk, key(hs))
		}
		slices.Sort(gk)
		slices.Sort(wk)
		return slices.Equal(gk, wk)
	}, func() string { return fmt.Sprintf("index %v\nengines %v", got, want) })

	// Every worker's inventory chains its blocks as vLLM does.
	parents := map[kv.EngineHash]*kv.EngineHash{}
	for _, h := range truth {
		for b, p := range h.parentOf() {
			parents[b] = p
		}
	}
	held := inventoryAgainstVLLM(t, watchWorkers(t, s.natsURL, realModel, len(vs)), parents)
	checked := 0
	for k, n := range held {
		if k.tier != kv.TierDevice || k.lora != "" {
			t.Fatalf("%d blocks stored on tier %v, LoRA %q: vLLM published medium GPU, no LoRA", n, k.tier, k.lora)
		}
		checked += n
	}
	if checked == 0 {
		t.Fatal("the workers' inventories hold no stored block")
	}
}

// inventoryKey is where a worker's inventory holds a block.
type inventoryKey struct {
	tier kv.Tier
	lora string
}

// inventoryAgainstVLLM dumps every worker's inventory (its gRPC Dump),
// checks each stored block's parent is the one vLLM's events give it
// (parents: vllmHoldings.parentOf), and counts the blocks by tier and
// LoRA name.
func inventoryAgainstVLLM(t *testing.T, ws *workerSet, parents map[kv.EngineHash]*kv.EngineHash) map[inventoryKey]int {
	t.Helper()
	held := map[inventoryKey]int{}
	for _, in := range ws.watcher.Instances() {
		c, err := ws.clients.Get(in)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		d, err := c.Dump(ctx, &api.DumpRequest{Worker: api.KeyToProto(kv.WorkerKey{Instance: in.ID})})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		evs, err := api.EventsFromProto(d.Events)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if e.Kind != kv.EventStored {
				continue
			}
			prev := (*kv.EngineHash)(nil)
			if e.HasParent {
				prev = &e.Parent
			}
			for _, blk := range e.Blocks {
				p, ok := parents[blk.EngineHash]
				if !ok || (p == nil) != (prev == nil) || (p != nil && *p != *prev) {
					t.Fatalf("block %d (LoRA %q): kvmesh's parent %v, vLLM's %v (known %v)", blk.EngineHash, e.LoRA, prev, p, ok)
				}
				h := blk.EngineHash
				prev = &h
				held[inventoryKey{e.Tier, e.LoRA}]++
			}
		}
	}
	return held
}
