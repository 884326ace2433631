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
	// uvicorn (every engine's server) closes an idle connection after 5 s.
	if tr, ok := c.Client.Transport.(*http.Transport); !ok || tr.IdleConnTimeout <= 0 || tr.IdleConnTimeout >= 5*time.Second {
		t.Fatalf("default transport %+v: idle connections must be let go before the engine's 5 s", c.Client.Transport)
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

func TestHintFormWithDefault(t *testing.T) {
	for in, want := range map[HintForm]HintForm{"": HintNative, HintNative: HintNative, HintBridge: HintBridge, HintOff: HintOff} {
		if got, err := in.WithDefault(); err != nil || got != want {
			t.Errorf("%q: %q, %v", in, got, err)
		}
	}
	if _, err := HintForm("kv_hint").WithDefault(); err == nil || err.Error() != `"kv_hint": want native, bridge or off` {
		t.Fatalf("unknown form: %v", err)
	}
}
