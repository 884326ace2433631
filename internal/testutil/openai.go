package testutil

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// Post sends body as JSON to url and returns the response (its body
// already read and closed) and the body.
func Post(t testing.TB, url, body string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// SSEEvents reads an OpenAI event stream into its data payloads (without
// [DONE]) and reports whether [DONE] closed it.
func SSEEvents(t testing.TB, r io.Reader) (events []map[string]any, done bool) {
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

// ChatDeltas joins the text of a stream's events (chat deltas or
// completion text) and returns the last finish_reason it saw.
func ChatDeltas(events []map[string]any) (text string, finish any) {
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
