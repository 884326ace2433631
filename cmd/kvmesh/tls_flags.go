package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/spf13/pflag"
)

// tlsFlags configure mutual TLS between kvmesh processes: the worker API
// and the control endpoints.
type tlsFlags struct{ cert, key, ca string }

func (tf *tlsFlags) register(f *pflag.FlagSet) {
	f.StringVar(&tf.cert, "tls-cert", "", "PEM certificate this process presents to fleet peers (mutual TLS on the worker API and control endpoints; with --tls-key and --tls-ca)")
	f.StringVar(&tf.key, "tls-key", "", "PEM private key of --tls-cert")
	f.StringVar(&tf.ca, "tls-ca", "", "PEM CA bundle fleet peers' certificates must chain to")
}

// configs loads the server side (which requires and verifies client
// certificates) and the client side; both nil when no flag is set.
func (tf *tlsFlags) configs() (server, client *tls.Config, err error) {
	if tf.cert == "" && tf.key == "" && tf.ca == "" {
		return nil, nil, nil
	}
	for _, f := range []struct{ name, v string }{{"tls-cert", tf.cert}, {"tls-key", tf.key}, {"tls-ca", tf.ca}} {
		if f.v == "" {
			return nil, nil, fmt.Errorf("--%s: required with --tls-cert, --tls-key and --tls-ca (mutual TLS needs all three)", f.name)
		}
	}
	pair, err := tls.LoadX509KeyPair(tf.cert, tf.key)
	if err != nil {
		return nil, nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	pem, err := os.ReadFile(tf.ca)
	if err != nil {
		return nil, nil, fmt.Errorf("--tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, nil, fmt.Errorf("--tls-ca %s: no PEM certificate in it", tf.ca)
	}
	server = &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}
	client = &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, MinVersion: tls.VersionTLS13}
	return server, client, nil
}
