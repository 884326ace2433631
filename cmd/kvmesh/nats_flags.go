package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/internal/fleetkey"
	"github.com/kvmesh/kvmesh/natsbus"
)

// natsFlags are the NATS client flags of every command that joins a
// cluster (`worker`, `frontend`, and `serve` with an external server), so
// they read the same everywhere.
type natsFlags struct {
	url, creds, ca, cert, key string
	// cred proves this process's identity to a kvmesh embedded server
	// (identify); discoveryKey signs and checks discovery records.
	cred         *natsbus.Credential
	discoveryKey []byte
}

// identify derives what the fleet token proves: the NATS identity id (for
// the embedded server of a `serve` with the same token; any other server
// ignores it) and the discovery key. Credentials of the user's own
// (--nats-creds, user:password@ in the URL) take precedence over the
// identity; without a token there is neither.
func (n *natsFlags) identify(token string, id natsbus.Identity) error {
	if token == "" {
		return nil
	}
	n.discoveryKey = fleetkey.Derive(token, fleetkey.Discovery)
	if n.creds != "" || strings.Contains(n.url, "@") {
		return nil
	}
	cred, err := natsbus.FleetCredential(fleetkey.Derive(token, fleetkey.NATS), id)
	if err != nil {
		return err
	}
	n.cred = cred
	return nil
}

func (n *natsFlags) register(f *pflag.FlagSet) {
	n.registerURL(f, "nats://127.0.0.1:4222", "NATS server URL(s), comma-separated")
}

// registerURL is register with another default and help for --nats.
func (n *natsFlags) registerURL(f *pflag.FlagSet, def, help string) {
	f.StringVar(&n.url, "nats", def, help)
	f.StringVar(&n.creds, "nats-creds", "", "NATS credentials file (a user JWT and its nkey seed, as nsc writes it) for a server in operator mode")
	f.StringVar(&n.ca, "nats-ca", "", "CA certificate to trust for NATS TLS (tls:// URLs; default: the system roots)")
	f.StringVar(&n.cert, "nats-cert", "", "client certificate for NATS TLS")
	f.StringVar(&n.key, "nats-key", "", "client key for NATS TLS")
}

// conn returns the connection settings for a client called name.
func (n *natsFlags) conn(name string, log *slog.Logger) natsbus.ConnConfig {
	return natsbus.ConnConfig{URLs: n.url, Name: name, CredsFile: n.creds, Credential: n.cred,
		CAFile: n.ca, CertFile: n.cert, KeyFile: n.key, Logger: log}
}

// controlPlane connects to NATS as name and opens discovery on it; the
// caller closes the connection.
func (nf *natsFlags) controlPlane(ctx context.Context, name string, log *slog.Logger) (*nats.Conn, *discovery.Discovery, error) {
	nc, err := nf.connect(name, log)
	if err != nil {
		return nil, nil, err
	}
	disc, err := discovery.Open(ctx, nc, discovery.Config{Key: nf.discoveryKey, Logger: log})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, disc, nil
}

// connect dials NATS as name; a refusal by the server, or a server
// certificate the client cannot trust, names the flag to fix.
func (n *natsFlags) connect(name string, log *slog.Logger) (*nats.Conn, error) {
	nc, err := natsbus.Connect(n.conn(name, log))
	if err != nil {
		return nil, n.explain(err)
	}
	return nc, nil
}

func (n *natsFlags) explain(err error) error {
	var unknownCA x509.UnknownAuthorityError
	var verify *tls.CertificateVerificationError
	var host x509.HostnameError
	switch {
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired), errors.Is(err, nats.ErrAuthRevoked):
		if n.creds != "" {
			return fmt.Errorf("--nats-creds %s: the NATS server refused these credentials: %w", n.creds, err)
		}
		if n.cred != nil {
			return fmt.Errorf("--fleet-token-file: the NATS server refused the identity this fleet token proves (a kvmesh serve's embedded server takes the token that serve was given): %w", err)
		}
		return fmt.Errorf("--nats: the NATS server requires credentials (--fleet-token-file for a kvmesh serve's embedded server, --nats-creds, or user:password@ in the URL): %w", err)
	case errors.Is(err, nats.ErrSecureConnRequired):
		return fmt.Errorf("--nats: the NATS server requires TLS (a tls:// URL, and --nats-ca for a private CA): %w", err)
	case errors.As(err, &verify), errors.As(err, &unknownCA), errors.As(err, &host):
		if n.ca == "" {
			return fmt.Errorf("--nats-ca: the NATS server's certificate is not trusted by the system roots; name its CA with --nats-ca: %w", err)
		}
		return fmt.Errorf("--nats-ca %s: the NATS server's certificate does not verify against it: %w", n.ca, err)
	case n.creds != "" && !errors.Is(err, nats.ErrNoServers) && strings.Contains(err.Error(), "nats: connect") &&
		(strings.Contains(err.Error(), "jwt") || strings.Contains(err.Error(), "nkey") || strings.Contains(err.Error(), "seed")):
		return fmt.Errorf("--nats-creds %s: not a usable NATS credentials file (user JWT and nkey seed): %w", n.creds, err)
	}
	return err
}
