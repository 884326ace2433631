package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
)

func TestBenchRouteSmall(t *testing.T) {
	cmd := newBenchRouteCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--workers", "8", "--prompt-tokens", "1024", "--prompts", "4", "--iterations", "200", "--warmup", "10", "--in-flight", "16"})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	last := lines[len(lines)-1]
	if !regexp.MustCompile(`^route: p50 [0-9]+\.[0-9] µs, p99 [0-9]+\.[0-9] µs$`).MatchString(last) {
		t.Fatalf("last line %q\n%s", last, out.String())
	}
	if !strings.Contains(out.String(), "decisions: 200") {
		t.Fatalf("output:\n%s", out.String())
	}
}

func TestBenchRouteRejectsBadFlags(t *testing.T) {
	cmd := newBenchRouteCmd()
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetArgs([]string{"--iterations", "0"})
	if err := cmd.ExecuteContext(context.Background()); err == nil {
		t.Fatal("--iterations 0 accepted")
	}
}
