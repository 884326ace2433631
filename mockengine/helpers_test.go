package mockengine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
)

const testModel = "mock-model"

// testSim is a small, unthrottled engine: 16-token blocks, no waiting.
func testSim() sim.Config {
	c := sim.DefaultConfig()
	c.Model = testModel
	c.BlockSize = 16
	c.Blocks = 256
	c.SpeedupRatio = 0
	return c
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// startVLLM runs a stand-in on an httptest server; both stop at cleanup.
func startVLLM(t *testing.T, cfg VLLMConfig) (*VLLM, string) {
	t.Helper()
	if cfg.Sim.Model == "" {
		cfg.Sim = testSim()
	}
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	cfg.EnablePromptTokensDetails = true
	v, err := NewVLLM(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(v.Handler())
	t.Cleanup(func() {
		srv.Close()
		if err := v.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return v, srv.URL
}

func post(t *testing.T, url string, body any, hdr map[string]string) (int, []byte) {
	t.Helper()
	var b []byte
	switch x := body.(type) {
	case string:
		b = []byte(x)
	default:
		var err error
		if b, err = json.Marshal(body); err != nil {
			t.Fatal(err)
		}
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

func get(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%v in %s", err, b)
	}
	return v
}

// sseEvents splits an SSE body into its data payloads ([DONE] included).
func sseEvents(t *testing.T, body []byte) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		d, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("not an SSE data line: %q", line)
		}
		out = append(out, d)
	}
	return out
}

func seqTokens(n, from int) []kv.Token {
	out := make([]kv.Token, n)
	for i := range out {
		out[i] = kv.Token(from + i)
	}
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// completion is the non-streamed response as a client reads it.
type completion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index          int        `json:"index"`
		Text           string     `json:"text"`
		FinishReason   string     `json:"finish_reason"`
		TokenIDs       []kv.Token `json:"token_ids"`
		PromptTokenIDs []kv.Token `json:"prompt_token_ids"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
}

type apiErr struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	} `json:"error"`
}

// ids is n consecutive token ids from base.
func ids(n int, base kv.Token) []kv.Token {
	out := make([]kv.Token, n)
	for i := range out {
		out[i] = base + kv.Token(i)
	}
	return out
}
