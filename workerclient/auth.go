package workerclient

import (
	"context"

	"google.golang.org/grpc"
)

// TokenMetadataKey carries the fleet token on every worker API call, as
// "Bearer <token>" (the worker checks it: worker.Config.FleetToken).
const TokenMetadataKey = "authorization"

// WithFleetToken is the dial option that sends token on every call of a
// Pool's connections (NewPool(WithFleetToken(t))).
func WithFleetToken(token string) grpc.DialOption {
	return grpc.WithPerRPCCredentials(tokenCreds(token))
}

type tokenCreds string

func (t tokenCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{TokenMetadataKey: "Bearer " + string(t)}, nil
}

// RequireTransportSecurity is false: the token is also the credential of
// plaintext fleets on a private network (TLS is configured separately).
func (tokenCreds) RequireTransportSecurity() bool { return false }
