package frontend

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// loraBackend is the fake backend whose workers registered LoRA adapters.
type loraBackend struct {
	*fakeBackend
	adapters map[string][]string
}

func (b loraBackend) Adapters(model string) []string { return b.adapters[model] }

// A request whose model names a registered adapter goes to the adapter's
// base model with the adapter as its LoRA, and is answered under the
// adapter's name; /v1/models lists the adapters with their parent; an
// unregistered name is a 404 as before.
func TestLoRAModelField(t *testing.T) {
	fb := &fakeBackend{reply: "ok", maxContext: 4096}
	reg := prometheus.NewRegistry()
	s := New(DefaultConfig(), loraBackend{fb, map[string][]string{"test-model": {"sql-lora"}}}, models{testModel()}, reg, reg)
	ts := newTestServerFor(t, s)

	resp, body := post(t, ts.URL+"/v1/chat/completions", `{"model":"sql-lora","messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != 200 || !strings.Contains(body, `"model":"sql-lora"`) {
		t.Fatalf("adapter request: %d %s", resp.StatusCode, body)
	}
	resp, body = post(t, ts.URL+"/v1/completions", `{"model":"test-model","prompt":"hi"}`)
	if resp.StatusCode != 200 {
		t.Fatalf("base request: %d %s", resp.StatusCode, body)
	}
	if len(fb.requests) != 2 || fb.requests[0].Model != "test-model" || fb.requests[0].LoRA != "sql-lora" || fb.requests[1].LoRA != "" {
		t.Fatalf("backend saw %+v", fb.requests)
	}
	resp, body = post(t, ts.URL+"/v1/completions", `{"model":"other-lora","prompt":"hi"}`)
	if resp.StatusCode != 404 || !strings.Contains(body, `"param":"model"`) {
		t.Fatalf("unregistered adapter: %d %s", resp.StatusCode, body)
	}

	r, err := http.Get(ts.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var list struct {
		Data []modelCard `json:"data"`
	}
	if err := json.NewDecoder(r.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	if len(list.Data) != 2 || list.Data[0].ID != "test-model" || list.Data[1].ID != "sql-lora" || list.Data[1].Parent != "test-model" ||
		list.Data[0].Parent != "" || list.Data[1].MaxModelLen != 4096 {
		t.Fatalf("/v1/models: %+v", list.Data)
	}
	r2, err := http.Get(ts.URL + "/v1/models/sql-lora")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r2.Body)
	r2.Body.Close()
	if r2.StatusCode != 200 || !strings.Contains(string(b), `"parent":"test-model"`) {
		t.Fatalf("/v1/models/sql-lora: %d %s", r2.StatusCode, b)
	}
}
