package worker

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"io"
	"net"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/workerclient"
)

// errUnauthenticated answers a worker API call without the fleet token.
var errUnauthenticated = status.Error(codes.Unauthenticated, "worker API: this worker requires the fleet token")

// tokenGuard checks the fleet token on every worker API call before the
// handler runs, so a caller without it reaches neither Generate nor the
// event and dump queries. Refusals are counted and logged once per host.
type tokenGuard struct {
	w    *Worker
	want [sha256.Size]byte
	log  onceper
}

func (g *tokenGuard) check(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	ok := 0
	for _, v := range md.Get(workerclient.TokenMetadataKey) {
		sum := sha256.Sum256([]byte(v))
		ok |= subtle.ConstantTimeCompare(sum[:], g.want[:])
	}
	if ok == 1 {
		return nil
	}
	g.w.unauthenticated.Add(1)
	var addr net.Addr
	if p, found := peer.FromContext(ctx); found {
		addr = p.Addr
	}
	if host, first := g.log.first(addr); first {
		g.w.log.Warn("worker API: refused a caller without the fleet token (logged once per host)", "peer", host)
	}
	return errUnauthenticated
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
// Config.FleetToken.
func (w *Worker) authOptions() []grpc.ServerOption {
	var opts []grpc.ServerOption
	if w.cfg.TLS != nil {
		opts = append(opts, grpc.Creds(countingTLS{TransportCredentials: credentials.NewTLS(w.cfg.TLS), w: w, log: &onceper{}}))
	}
	if w.cfg.FleetToken == "" {
		return opts
	}
	g := &tokenGuard{w: w, want: sha256.Sum256([]byte("Bearer " + w.cfg.FleetToken))}
	return append(opts,
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := g.check(ctx); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := g.check(ss.Context()); err != nil {
				return err
			}
			return h(srv, ss)
		}),
	)
}
