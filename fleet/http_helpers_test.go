package fleet

// HTTP helpers for the tests that drive the fleet through the frontend
// (sampling_test.go, stall_e2e_test.go); frontend's own tests keep theirs.

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/frontend"
)

// servedModels is what the frontend serves in front of the fleet.
func servedModels(ms ...*frontend.Model) *frontend.StaticModels {
	var s frontend.StaticModels
	for _, m := range ms {
		s.Add(m)
	}
	return &s
}

func post(t *testing.T, url, body string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// sseEvents reads a stream into its data payloads (without [DONE]) and
// reports whether [DONE] closed it.
func sseEvents(t *testing.T, r io.Reader) (events []map[string]any, done bool) {
	t.Helper()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		data := strings.TrimPrefix(line, "data: ")
		if data == "[DONE]" {
			done = true
			continue
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("bad event %q: %v", data, err)
		}
		events = append(events, ev)
	}
	return events, done
}

func chatDeltas(events []map[string]any) (text string, finish any) {
	for _, ev := range events {
		ch, _ := ev["choices"].([]any)
		for _, c := range ch {
			cm := c.(map[string]any)
			if d, ok := cm["delta"].(map[string]any); ok {
				if s, ok := d["content"].(string); ok {
					text += s
				}
			}
			if t, ok := cm["text"].(string); ok {
				text += t
			}
			if cm["finish_reason"] != nil {
				finish = cm["finish_reason"]
			}
		}
	}
	return
}
