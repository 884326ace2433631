package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// `kvmesh serve --lora`: the adapter is listed in /v1/models and served
// under its name; the same prompt shares its prefix with itself, never
// with the base model; an adapter nobody serves is a 404.
func TestServeLoRA(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	s := startServe(t, "--workers", "2", "--lora", "sql-lora", "--speedup-ratio", "0")
	defer s.stop(t)
	r, err := http.Get(s.base + "/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []struct {
			ID     string `json:"id"`
			Parent string `json:"parent"`
		} `json:"data"`
	}
	err = json.NewDecoder(r.Body).Decode(&list)
	r.Body.Close()
	if err != nil || len(list.Data) != 2 || list.Data[1].ID != "sql-lora" || list.Data[1].Parent != "kvmesh-sim" {
		t.Fatalf("/v1/models: %+v (%v)", list.Data, err)
	}
	sys := strings.Repeat("You answer questions about SQL databases. ", 40)
	cached := func(model string) float64 {
		t.Helper()
		resp, body := testutil.Post(t, s.base+"/chat/completions", `{"model":"`+model+`","max_tokens":2,"messages":[{"role":"system","content":"`+sys+`"},{"role":"user","content":"hi"}]}`)
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"model":"`+model+`"`) {
			t.Fatalf("%s: %d %s", model, resp.StatusCode, body)
		}
		var out struct {
			Usage struct {
				Details struct {
					Cached float64 `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(body), &out); err != nil {
			t.Fatal(err)
		}
		return out.Usage.Details.Cached
	}
	if n := cached("sql-lora"); n != 0 {
		t.Fatalf("first sql-lora request: %v cached", n)
	}
	if n := cached("kvmesh-sim"); n != 0 {
		t.Fatalf("the base model found %v of the adapter's tokens cached", n)
	}
	if n := cached("sql-lora"); n == 0 {
		t.Fatal("the second sql-lora request found nothing cached")
	}
	resp, body := testutil.Post(t, s.base+"/chat/completions", `{"model":"chat-lora","messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(body, `"param":"model"`) {
		t.Fatalf("unknown adapter: %d %s", resp.StatusCode, body)
	}
}
