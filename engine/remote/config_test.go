package remote

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// TestConfigWithDefaults: the URL comes back canonical, unset fields get
// their defaults, set ones stay, and a bad URL names the engine kind.
func TestConfigWithDefaults(t *testing.T) {
	c, err := Config{URL: "http://127.0.0.1:8000/"}.WithDefaults("vllm")
	if err != nil {
		t.Fatal(err)
	}
	if c.URL != "http://127.0.0.1:8000" || c.Role != kv.RoleAggregated || c.DPSize != 1 ||
		c.StatsInterval != DefaultStatsInterval || c.HealthInterval != DefaultHealthInterval || c.Client == nil || c.Logger == nil {
		t.Fatalf("defaults %+v", c)
	}
	client, log := &http.Client{}, slog.New(slog.DiscardHandler)
	set := Config{URL: "https://e:1", Model: "m", Role: kv.RolePrefill, DPSize: 4, BlockSize: 32, Events: "tcp://e:5557",
		ReplayEvents: "tcp://e:5558", Topic: "kv", StatsInterval: time.Second, HealthInterval: time.Minute, Client: client, Logger: log}
	if c, err := set.WithDefaults("sglang"); err != nil || c != set {
		t.Fatalf("set fields changed: %+v, %v", c, err)
	}
	for _, bad := range []string{"", "127.0.0.1:8000", "tcp://e:1", "http://e:1/?q=1"} {
		if _, err := (Config{URL: bad}).WithDefaults("trtllm"); err == nil || !strings.HasPrefix(err.Error(), "trtllm engine url: ") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
