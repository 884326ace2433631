package remote

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

func TestPickModel(t *testing.T) {
	var answer atomic.Value
	answer.Store(`{"object":"list","data":[{"id":"a","max_model_len":4096},{"id":"b"}]}`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/models" {
			http.NotFound(w, r)
			return
		}
		io.WriteString(w, answer.Load().(string))
	}))
	defer srv.Close()
	ctx := context.Background()
	for want, got := range map[string]ServedModel{"": {ID: "a", MaxModelLen: 4096}, "a": {ID: "a", MaxModelLen: 4096}, "b": {ID: "b"}} {
		if m, err := PickModel(ctx, srv.Client(), srv.URL, want, "vllm"); err != nil || m != got {
			t.Errorf("%q: %+v, %v", want, m, err)
		}
	}
	if _, err := PickModel(ctx, srv.Client(), srv.URL, "c", "vllm"); err == nil ||
		err.Error() != "vllm engine "+srv.URL+` does not serve model "c" (it serves ["a" "b"])` {
		t.Errorf("unserved model: %v", err)
	}
	answer.Store(`{"object":"list","data":[]}`)
	if _, err := PickModel(ctx, srv.Client(), srv.URL, "", "trtllm"); err == nil || err.Error() != "trtllm engine "+srv.URL+" serves no model" {
		t.Errorf("no model: %v", err)
	}
	if _, err := PickModel(ctx, srv.Client(), srv.URL+"/nothing", "", "trtllm"); err == nil || !strings.HasPrefix(err.Error(), "trtllm engine models: ") {
		t.Errorf("no /v1/models: %v", err)
	}
}
