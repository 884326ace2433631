package transfer

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) { l.mu.Lock(); defer l.mu.Unlock(); return l.b.Write(p) }
func (l *logBuf) String() string              { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// A source with a fleet token serves only clients that prove the same
// token; any other peer is refused before it can name a block, counted,
// and logged once per host. A client with a token refuses a source that
// cannot prove it either.
func TestFleetTokenHandshake(t *testing.T) {
	src := NewMemSource(2, 64)
	src.Add(1, 2, 3)
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	var logs logBuf
	token := []byte("fleet-secret")
	ep := startServer(t, &Server{Source: src, Metrics: m, Token: token, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	fetch := func(tok []byte) (FetchResult, error) {
		c := NewClient(ClientOptions{Token: tok, Timeout: 2 * time.Second})
		defer c.Close()
		res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: []uint64{1, 2, 3}})
		defer res.Release()
		return res, err
	}
	if res, err := fetch(token); err != nil || res.Completed != 3 {
		t.Fatalf("with the token: %d blocks, %v", res.Completed, err)
	}
	for _, tok := range [][]byte{nil, []byte("wrong"), []byte("fleet-secreT")} {
		res, err := fetch(tok)
		if res.Completed != 0 || err == nil {
			t.Fatalf("token %q: %d blocks, %v", tok, res.Completed, err)
		}
		if tok != nil && (!errors.Is(err, ErrUnauthenticated) || res.Outcome != OutcomeRefused) {
			t.Errorf("token %q: %v %v, want refused unauthenticated", tok, res.Outcome, err)
		}
	}
	// The source counts a refusal when it sees the client hang up.
	testutil.WaitFor(t, 10*time.Second, "3 unauthenticated refusals counted", func() bool {
		return testutil.Value(t, reg, "kvmesh_transfer_refused_total", "reason", "unauthenticated") == 3
	})
	if n := strings.Count(logs.String(), "without the fleet token"); n != 1 {
		t.Errorf("logged %d times, want once per host:\n%s", n, logs.String())
	}
	if v := testutil.Value(t, reg, "kvmesh_transfer_blocks_total", "operation", "serve"); v != 3 {
		t.Errorf("%v blocks served, want only the authenticated fetch's 3", v)
	}

	// A raw peer that names blocks at once is refused unread.
	addr := strings.TrimPrefix(ep, "tcp://")
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.Write(appendFetch(nil, 1, fetchReq{timeoutMs: 1000, hashes: []uint64{1}}))
	nc.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := readFrame(nc, typeChallenge, challengeLen); err == nil || !strings.Contains(err.Error(), "unauthenticated") {
		t.Fatalf("a raw fetch got %v, want an unauthenticated refusal", err)
	}

	// A client with a token refuses a source without one.
	open := startServer(t, &Server{Source: src})
	c := NewClient(ClientOptions{Token: token, Timeout: 2 * time.Second})
	defer c.Close()
	res, err := c.Fetch(context.Background(), open, FetchRequest{Hashes: []uint64{1}})
	if res.Completed != 0 || !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("a tokenless source: %d blocks, %v", res.Completed, err)
	}
	testutil.WaitFor(t, 10*time.Second, "pins released", func() bool { return src.Pins() == 0 })
}

// With mutual TLS a source serves only clients whose certificate its CA
// signed; a plaintext peer or one of another CA gets nothing and is counted.
func TestMutualTLS(t *testing.T) {
	pki := testutil.NewFleetPKI(t, "fleet")
	other := testutil.NewFleetPKI(t, "intruder")
	src := NewMemSource(2, 64)
	src.Add(1, 2)
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	ep := startServer(t, &Server{Source: src, Metrics: m, TLS: pki.Server, Logger: slog.New(slog.DiscardHandler)})
	for _, c := range []struct {
		name string
		opts ClientOptions
		want int
	}{
		{"fleet certificate", ClientOptions{TLS: pki.Client}, 2},
		{"plaintext", ClientOptions{}, 0},
		{"another CA's certificate", ClientOptions{TLS: other.Client}, 0},
		{"no client certificate", ClientOptions{TLS: &tls.Config{RootCAs: pki.Client.RootCAs, MinVersion: tls.VersionTLS13}}, 0},
	} {
		c.opts.Timeout = 2 * time.Second
		cl := NewClient(c.opts)
		res, err := cl.Fetch(context.Background(), ep, FetchRequest{Hashes: []uint64{1, 2}})
		if res.Completed != c.want || (c.want == 0) != (err != nil) {
			t.Errorf("%s: %d blocks, %v; want %d", c.name, res.Completed, err, c.want)
		}
		res.Release()
		cl.Close()
	}
	testutil.WaitFor(t, 10*time.Second, "3 refused peers counted", func() bool {
		return testutil.Value(t, reg, "kvmesh_transfer_refused_total", "reason", "unauthenticated") == 3
	})
}

// FuzzTokenServerHandle: whatever bytes a peer without the token sends, a
// source with a fleet token never pins a block and always hangs up.
func FuzzTokenServerHandle(f *testing.F) {
	cn := make([]byte, nonceLen)
	f.Add(appendFrame(nil, typeHello, cn))
	f.Add(append(appendFrame(nil, typeHello, cn), appendFrame(nil, typeAuth, make([]byte, proofLen))...))
	f.Add(appendFetch(nil, 1, fetchReq{timeoutMs: 1000, hashes: []uint64{11}}))
	f.Add(appendFrame(nil, typeAuth, make([]byte, proofLen)))
	src := NewMemSource(1, 64)
	src.Add(11)
	pinned := 0
	s := &Server{Source: pinCounter{src, &pinned}, IdleTimeout: time.Second, Token: []byte("fleet-secret")}
	s.once.Do(s.defaults)
	f.Fuzz(func(t *testing.T, in []byte) {
		cli, srv := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.handle(context.Background(), srv)
			srv.Close()
		}()
		go io.Copy(io.Discard, cli)
		cli.SetWriteDeadline(time.Now().Add(2 * time.Second))
		cli.Write(in)
		cli.Close()
		select {
		case <-done:
		case <-time.After(7 * time.Second):
			t.Fatal("handler did not return after the peer closed")
		}
		if pinned != 0 {
			t.Fatalf("an unauthenticated peer pinned blocks %d times", pinned)
		}
	})
}

type pinCounter struct {
	*MemSource
	n *int
}

func (p pinCounter) Pin(h []uint64) (int, func()) { *p.n++; return p.MemSource.Pin(h) }
