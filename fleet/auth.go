package fleet

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/kvmesh/kvmesh/workerclient"
)

// fleetDialOptions are the worker clients' credentials.
func fleetDialOptions(cfg Config) []grpc.DialOption {
	var opts []grpc.DialOption
	if cfg.TLS != nil {
		// Appended after the pool's plaintext default, so it replaces it.
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(cfg.TLS)))
	}
	if cfg.FleetToken != "" {
		opts = append(opts, workerclient.WithFleetToken(cfg.FleetToken))
	}
	return opts
}
