package main

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/natsbus"
)

// natsFlags are the NATS client flags of every command that joins a
// cluster (`worker`, `frontend`, and `serve` with an external server), so
// they read the same everywhere.
type natsFlags struct {
	url, creds, ca, cert, key string
}

func (n *natsFlags) register(f *pflag.FlagSet) {
	n.registerURL(f, "nats://127.0.0.1:4222", "NATS server URL(s), comma-separated")
}

// registerURL is register with another default and help for --nats.
func (n *natsFlags) registerURL(f *pflag.FlagSet, def, help string) {
	f.StringVar(&n.url, "nats", def, help)
	f.StringVar(&n.creds, "nats-creds", "", "NATS credentials file")
	f.StringVar(&n.ca, "nats-ca", "", "CA certificate to trust for NATS TLS")
	f.StringVar(&n.cert, "nats-cert", "", "client certificate for NATS TLS")
	f.StringVar(&n.key, "nats-key", "", "client key for NATS TLS")
}

// conn returns the connection settings for a client called name.
func (n *natsFlags) conn(name string, log *slog.Logger) natsbus.ConnConfig {
	return natsbus.ConnConfig{URLs: n.url, Name: name, CredsFile: n.creds,
		CAFile: n.ca, CertFile: n.cert, KeyFile: n.key, Logger: log}
}

// controlPlane connects to NATS as name and opens discovery on it; the
// caller closes the connection.
func (nf *natsFlags) controlPlane(ctx context.Context, name string, log *slog.Logger) (*nats.Conn, *discovery.Discovery, error) {
	nc, err := natsbus.Connect(nf.conn(name, log))
	if err != nil {
		return nil, nil, err
	}
	disc, err := discovery.Open(ctx, nc, discovery.Config{Logger: log})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, disc, nil
}
