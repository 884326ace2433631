package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestPprofLoopbackOnly(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "192.0.2.1:0", "nohost"} {
		if _, err := startPprof(addr); err == nil {
			t.Errorf("%s=%s: started, want refused", pprofEnv, addr)
		}
	}
	at, err := startPprof("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + at.String() + "/debug/pprof/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(b), "test") {
		t.Fatalf("cmdline: %d %q", resp.StatusCode, b)
	}
}
