package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func fakeStreamingServer(t *testing.T) *httptest.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"data":[{"id":"tiny"}]}`)
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 3; i++ {
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"completion_tokens\":3}}\n\ndata: [DONE]\n\n")
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func TestBenchLoadCommand(t *testing.T) {
	srv := fakeStreamingServer(t)
	dir := t.TempDir()
	cmd := newBenchLoadCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"--url", srv.URL + "/v1", "--synthetic", "--groups", "2", "--prompts-per-group", "3",
		"--system-len", "100", "--question-len", "10", "--output-len", "3", "--concurrency", "2",
		"--goodput", "ttft_ms<=60000,itl_ms<=60000", "--out", dir})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	last := lines[len(lines)-1]
	re := regexp.MustCompile(`^load: requests=6 ok=6 ttft_p50_ms=[0-9.]+ ttft_p99_ms=[0-9.]+ itl_p50_ms=[0-9.]+ output_tok_s=[0-9.]+ goodput=1\.000$`)
	if !re.MatchString(last) {
		t.Fatalf("last line %q\n%s", last, out.String())
	}
	if !strings.Contains(out.String(), "model=tiny") || !strings.Contains(errOut.String(), "progress: 6/6 done") {
		t.Fatalf("stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
	}
	for _, f := range []string{"report.json", "requests.jsonl", "summary.md", "ttft_cdf.svg", "latency_over_time.svg"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
}

func TestBenchLoadRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--url", "http://127.0.0.1:1/v1", "--synthetic", "--concurrency", "1", "--goodput", "ttft<=x"},
		{"--url", "http://127.0.0.1:1/v1", "--synthetic"},
		{"--synthetic", "--concurrency", "1"},
		{"--url", "http://127.0.0.1:1/v1", "--synthetic", "--trace", "x.jsonl", "--concurrency", "1"},
		{"--url", "http://127.0.0.1:1/v1", "--trace", "x.jsonl", "--speedup", "0"},
		{"--url", "http://127.0.0.1:1/v1", "--trace", "x.jsonl", "--speedup", "-2"},
	} {
		cmd := newBenchLoadCmd()
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		cmd.SetArgs(args)
		if err := cmd.ExecuteContext(context.Background()); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// When every request fails (here: the server knows no such model), the
// report still prints but the command fails, naming the error kinds.
func TestBenchLoadFailsWhenNothingSucceeds(t *testing.T) {
	srv := fakeStreamingServer(t)
	cmd := newBenchLoadCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"--url", srv.URL + "/v1", "--synthetic", "--groups", "1", "--prompts-per-group", "3",
		"--system-len", "10", "--question-len", "5", "--output-len", "3", "--concurrency", "1", "--model", "tiny", "--endpoint", "completions"})
	err := cmd.ExecuteContext(context.Background())
	if err == nil || err.Error() != "bench load: none of 3 requests succeeded (errors: http_404 3)" {
		t.Fatalf("err %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "load: requests=3 ok=0 ") {
		t.Errorf("no report:\n%s", out.String())
	}
	// The server's message, not only the status count.
	if !strings.Contains(out.String(), "  first http_404: ") {
		t.Errorf("no first error message:\n%s", out.String())
	}
}

// Without --trace or --synthetic, bench load replays KVMESH_TRACE like twin
// and bench index.
func TestBenchLoadReadsKVMESHTrace(t *testing.T) {
	t.Setenv("KVMESH_TRACE", filepath.Join(t.TempDir(), "missing.jsonl"))
	cmd := newBenchLoadCmd()
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"--url", "http://127.0.0.1:1/v1"})
	err := cmd.ExecuteContext(context.Background())
	if err == nil || !strings.Contains(err.Error(), "missing.jsonl") {
		t.Fatalf("err %v: want the KVMESH_TRACE file opened", err)
	}
}
