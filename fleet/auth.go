package fleet

import (
	"fmt"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/kv"
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

// The fleet credentials a worker may require, as metric labels.
const (
	credTLS   = "tls"
	credToken = "fleet_token"
)

// credFlags names the frontend flags that supply each credential.
var credFlags = map[string]string{credTLS: "--tls-cert/--tls-key/--tls-ca", credToken: "--fleet-token-file"}

// credRefusals counts requests a worker could not take for want of (or
// with wrong) fleet credentials, and remembers which workers were logged:
// a misconfigured frontend logs one line per worker, not one per request.
type credRefusals struct {
	count  *prometheus.CounterVec
	mu     sync.Mutex
	logged map[uint64]bool
}

func newCredRefusals() *credRefusals {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_fleet_credential_refusals_total",
		Help: "Requests failed because a worker requires fleet credentials this frontend lacks or that it refused, by credential: tls or fleet_token.",
	}, []string{"credential"})
	for _, c := range []string{credTLS, credToken} {
		v.WithLabelValues(c)
	}
	return &credRefusals{count: v, logged: map[uint64]bool{}}
}

// missingCredential names the credential in requires (from its discovery
// record) that this frontend was not given; "" when none is missing.
func (c *Cluster) missingCredential(in discovery.Instance) string {
	switch {
	case in.TLS && c.cfg.TLS == nil:
		return credTLS
	case in.FleetToken && c.cfg.FleetToken == "":
		return credToken
	}
	return ""
}

// refusedCredential tells a worker API error that refused this frontend's
// credentials (a wrong token, a certificate of another CA) from a lost
// worker: the credential, or "".
func refusedCredential(err error) string {
	st := status.Convert(err)
	switch {
	case st.Code() == codes.Unauthenticated:
		return credToken
	case st.Code() == codes.Unavailable && strings.Contains(st.Message(), "authentication handshake failed"):
		return credTLS
	}
	return ""
}

// credentialsRefused counts a request that worker w of instance in could
// not take for credential cred, logs the first for each worker, and
// returns the client's error (kv.ErrCredentials, naming the flags). cause
// is the worker's answer; nil when the frontend knew from discovery.
func (c *Cluster) credentialsRefused(in discovery.Instance, w kv.WorkerKey, cred string, cause error) error {
	flags := credFlags[cred]
	var msg string
	switch {
	case cause == nil && cred == credTLS:
		msg = fmt.Sprintf("worker %v at %s requires the fleet's mutual TLS and this frontend has no client certificate: start it with %s", w, in.GRPCAddr, flags)
	case cause == nil:
		msg = fmt.Sprintf("worker %v at %s requires the fleet token and this frontend has none: start it with %s", w, in.GRPCAddr, flags)
	default:
		msg = fmt.Sprintf("worker %v at %s refused this frontend's credentials (%v): check %s", w, in.GRPCAddr, status.Convert(cause).Message(), flags)
	}
	c.creds.count.WithLabelValues(cred).Inc()
	c.creds.mu.Lock()
	first := !c.creds.logged[in.ID]
	c.creds.logged[in.ID] = true
	c.creds.mu.Unlock()
	if first {
		c.log.Error("fleet credentials: "+msg, "model", in.Model, "worker", w, "flags", flags)
	}
	return fmt.Errorf("%w: %s", kv.ErrCredentials, msg)
}
