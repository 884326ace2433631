package fleet

import (
	"google.golang.org/grpc"

	"github.com/kvmesh/kvmesh/workerclient"
)

// fleetDialOptions are the worker clients' credentials.
func fleetDialOptions(cfg Config) []grpc.DialOption {
	if cfg.FleetToken == "" {
		return nil
	}
	return []grpc.DialOption{workerclient.WithFleetToken(cfg.FleetToken)}
}
