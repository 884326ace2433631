package frontend

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// A client that leaves a stream after its 200 went out is counted as 499,
// like one that leaves a non-streamed request.
func TestAbandonedStreamCounts499(t *testing.T) {
	b := &fakeBackend{reply: strings.Repeat("z", 1000), delay: 2 * time.Millisecond}
	reg := prometheus.NewRegistry()
	ts := httptest.NewServer(New(DefaultConfig(), b, models{testModel()}, reg, reg))
	defer func() { ts.Close(); http.DefaultClient.CloseIdleConnections() }()
	ctx, leave := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"test-model","messages":[{"role":"user","content":"q"}],"max_tokens":1000,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	for i := 0; i < 3 && sc.Scan(); i++ { // a few events: the stream is running
	}
	leave()
	resp.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	for fmt.Sprint(requestStatuses(t, reg)) != "[499]" {
		if time.Now().After(deadline) {
			t.Fatalf("statuses %v, want [499]", requestStatuses(t, reg))
		}
		time.Sleep(2 * time.Millisecond)
	}
}
