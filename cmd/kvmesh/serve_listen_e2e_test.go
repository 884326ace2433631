package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// A busy --listen port stops serve before NATS or any worker starts: at
// once, exit 1, one line naming the flag.
func TestServeBusyListenFailsFirst(t *testing.T) {
	bin := testutil.Binary(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "serve", "--listen", busy.Addr().String(), "--workers", "64", "--log-level", "info")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit %v, want 1; stderr %s", err, stderr.String())
	}
	want := "kvmesh: --listen " + busy.Addr().String() + ": "
	if !strings.HasPrefix(stderr.String(), want) || strings.Count(stderr.String(), "\n") != 1 {
		t.Fatalf("stderr %q, want one line starting %q (nothing logged before it)", stderr.String(), want)
	}
}

// --nats-listen pins the embedded NATS port, so workers and frontends can
// be pointed at it before serve starts.
func TestServeNATSListenPinsPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	s := startServe(t, "--workers", "1", "--nats-listen", fmt.Sprintf("127.0.0.1:%d", port))
	defer s.stop(t)
	if want := fmt.Sprintf("nats://127.0.0.1:%d", port); s.natsURL != want {
		t.Fatalf("NATS at %s, want %s", s.natsURL, want)
	}
}
