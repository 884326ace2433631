package worker

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
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

	mu     sync.Mutex
	warned map[string]bool
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
	host := "unknown"
	if p, found := peer.FromContext(ctx); found && p.Addr != nil {
		if h, _, err := net.SplitHostPort(p.Addr.String()); err == nil {
			host = h
		}
	}
	g.mu.Lock()
	first := !g.warned[host] && len(g.warned) < 1024
	if first {
		g.warned[host] = true
	}
	g.mu.Unlock()
	if first {
		g.w.log.Warn("worker API: refused a caller without the fleet token (logged once per host)", "peer", host)
	}
	return errUnauthenticated
}

// authOptions are the gRPC server options that enforce Config.TLS and
// Config.FleetToken.
func (w *Worker) authOptions() []grpc.ServerOption {
	var opts []grpc.ServerOption
	if w.cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(w.cfg.TLS)))
	}
	if w.cfg.FleetToken == "" {
		return opts
	}
	g := &tokenGuard{w: w, want: sha256.Sum256([]byte("Bearer " + w.cfg.FleetToken)), warned: map[string]bool{}}
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
