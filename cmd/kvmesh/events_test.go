package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
)

// freeTCPEndpoint is a loopback address nothing listens on.
func freeTCPEndpoint(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "tcp://" + addr
}

// The help's two promises: --timeout without --count is a listening window
// (exit 0, the count on stderr); with --count it is a failure.
func TestEventsListenTimeoutAsHelpSays(t *testing.T) {
	ep := freeTCPEndpoint(t)
	run := func(args ...string) (string, error) {
		cmd := newEventsListenCmd()
		var stderr bytes.Buffer
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&stderr)
		cmd.SetArgs(append([]string{"--endpoint", ep}, args...))
		err := cmd.ExecuteContext(context.Background())
		return stderr.String(), err
	}
	if stderr, err := run("--timeout", "150ms"); err != nil || !strings.Contains(stderr, "events listen: 0 events") {
		t.Fatalf("window: err %v stderr %q", err, stderr)
	}
	if _, err := run("--timeout", "150ms", "--count", "2"); err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Fatalf("count: err %v, want timed out", err)
	}
	if help := newEventsListenCmd().Flags().Lookup("timeout").Usage; !strings.Contains(help, "without: listen this long, then exit 0") {
		t.Fatalf("help %q", help)
	}
}
