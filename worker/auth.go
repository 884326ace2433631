package worker

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/internal/fleetkey"
	"github.com/kvmesh/kvmesh/workerclient"
)

// errUnauthenticated answers a worker API call without a valid fleet proof.
var errUnauthenticated = status.Error(codes.Unauthenticated, "worker API: this worker requires proof of the fleet token")

// proofGuard checks the fleet proof (workerclient.ProofMetadataKey) on
// every worker API call before the handler runs, so a caller without the
// fleet token reaches neither Generate nor the event and dump queries. A
// proof counts only for this worker's advertised address, within
// workerclient.ProofWindow, and once. Refusals are counted and logged once
// per host.
type proofGuard struct {
	w    *Worker
	key  []byte
	addr string // the advertised address proofs must name
	log  onceper

	mu sync.Mutex
	// seen and prev are the nonces accepted since the last rotation and in
	// the span before it; rotations are 2×ProofWindow apart, so a nonce is
	// remembered as long as its proof's time is acceptable.
	seen, prev map[string]struct{}
	rotated    time.Time
}

func newProofGuard(w *Worker, token, addr string) *proofGuard {
	return &proofGuard{w: w, key: fleetkey.Derive(token, fleetkey.WorkerAPI), addr: addr, seen: map[string]struct{}{}}
}

func (g *proofGuard) check(ctx context.Context, method string) error {
	md, _ := metadata.FromIncomingContext(ctx)
	now := time.Now()
	for _, v := range md.Get(workerclient.ProofMetadataKey) {
		if g.accept(v, method, now) {
			return nil
		}
	}
	g.w.unauthenticated.Add(1)
	var addr net.Addr
	if p, found := peer.FromContext(ctx); found {
		addr = p.Addr
	}
	if host, first := g.log.first(addr); first {
		g.w.log.Warn("worker API: refused a caller without a valid proof of the fleet token (logged once per host)", "peer", host)
	}
	return errUnauthenticated
}

func (g *proofGuard) accept(v, method string, now time.Time) bool {
	p, err := workerclient.ParseProof(v)
	if err != nil {
		return false
	}
	if d := now.Sub(p.At); d > workerclient.ProofWindow || d < -workerclient.ProofWindow {
		return false
	}
	// gRPC drops a :443 from the authority it signs.
	if !p.Valid(g.key, g.addr, method) && !p.Valid(g.key, strings.TrimSuffix(g.addr, ":443"), method) {
		return false
	}
	return g.fresh(p.Nonce, now)
}

// fresh records nonce, false when it was already used.
func (g *proofGuard) fresh(nonce string, now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if now.Sub(g.rotated) >= 2*workerclient.ProofWindow {
		g.prev, g.seen, g.rotated = g.seen, map[string]struct{}{}, now
	}
	if _, used := g.seen[nonce]; used {
		return false
	}
	if _, used := g.prev[nonce]; used {
		return false
	}
	g.seen[nonce] = struct{}{}
	return true
}

// onceper remembers the hosts already logged (at most maxWarnedHosts).
type onceper struct {
	mu     sync.Mutex
	warned map[string]bool
}

const maxWarnedHosts = 1024

// first returns addr's host and whether it is the first time it is seen.
func (o *onceper) first(addr net.Addr) (string, bool) {
	host := "unknown"
	if addr != nil {
		if h, _, err := net.SplitHostPort(addr.String()); err == nil {
			host = h
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.warned == nil {
		o.warned = map[string]bool{}
	}
	if o.warned[host] || len(o.warned) >= maxWarnedHosts {
		return host, false
	}
	o.warned[host] = true
	return host, true
}

// countingTLS is the worker API's TLS: a client that fails the handshake
// (no certificate, one of another CA, plaintext) never reaches a handler,
// so it is counted and logged (once per host) here.
type countingTLS struct {
	credentials.TransportCredentials
	w   *Worker
	log *onceper
}

func (c countingTLS) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil && !errors.Is(err, io.EOF) { // EOF: the caller left before saying anything
		c.w.tlsRefused.Add(1)
		if host, first := c.log.first(raw.RemoteAddr()); first {
			c.w.log.Warn("worker API: refused a caller that failed the TLS handshake (logged once per host)", "peer", host, "err", err)
		}
	}
	return conn, info, err
}

func (c countingTLS) Clone() credentials.TransportCredentials {
	return countingTLS{TransportCredentials: c.TransportCredentials.Clone(), w: c.w, log: c.log}
}

// authOptions are the gRPC server options that enforce Config.TLS and
// Config.FleetToken; addr is the advertised address proofs must name.
func (w *Worker) authOptions(addr string) []grpc.ServerOption {
	var opts []grpc.ServerOption
	if w.cfg.TLS != nil {
		opts = append(opts, grpc.Creds(countingTLS{TransportCredentials: credentials.NewTLS(w.cfg.TLS), w: w, log: &onceper{}}))
	}
	if w.cfg.FleetToken == "" {
		return opts
	}
	g := newProofGuard(w, w.cfg.FleetToken, addr)
	return append(opts,
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := g.check(ctx, info.FullMethod); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := g.check(ss.Context(), info.FullMethod); err != nil {
				return err
			}
			return h(srv, ss)
		}),
	)
}
