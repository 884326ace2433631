package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"

	"crypto/rand"
	"encoding/hex"

	"github.com/spf13/pflag"

	"github.com/kvmesh/kvmesh/frontend"
)

// apiKeysEnv holds API keys themselves (comma or newline separated), for
// deployments that inject secrets as environment variables; it adds to
// --api-key-file.
const apiKeysEnv = "KVMESH_API_KEYS"

// authFlags are the frontend's client authentication flags.
type authFlags struct {
	apiKeyFile   string
	adminKeyFile string
	openMetrics  bool
}

func (af *authFlags) register(f *pflag.FlagSet) {
	f.StringVar(&af.apiKeyFile, "api-key-file", "", "file of API keys, one per line, each at least 16 characters: every API route then needs Authorization: Bearer <key> (/health and /live stay open); "+apiKeysEnv+" may hold more keys")
	f.StringVar(&af.adminKeyFile, "admin-key-file", "", "file of admin keys, one per line, each at least 16 characters: the /debug routes (the router's KV index) need one as Authorization: Bearer <key>, and are 404 without this flag; an API key is not one")
	f.BoolVar(&af.openMetrics, "open-metrics", false, "with API keys, serve /metrics and /dashboard without one (for a scraper or a browser on a trusted network; the dashboard then leaves out the workers' addresses)")
}

// apiKeys reads the configured keys; nil when none are configured.
func (af *authFlags) apiKeys() (*frontend.APIKeys, error) {
	var texts []string
	if af.apiKeyFile != "" {
		b, err := os.ReadFile(af.apiKeyFile)
		if err != nil {
			return nil, fmt.Errorf("--api-key-file: %w", err)
		}
		if _, err := frontend.ParseAPIKeys(string(b)); err != nil {
			return nil, fmt.Errorf("--api-key-file %s: %w", af.apiKeyFile, err)
		}
		texts = append(texts, string(b))
	}
	if v := os.Getenv(apiKeysEnv); v != "" {
		if _, err := frontend.ParseAPIKeys(v); err != nil {
			return nil, fmt.Errorf("%s: %w", apiKeysEnv, err)
		}
		texts = append(texts, v)
	}
	if len(texts) == 0 {
		return nil, nil
	}
	return frontend.ParseAPIKeys(texts...)
}

// adminKeys reads --admin-key-file; nil without it.
func (af *authFlags) adminKeys() (*frontend.APIKeys, error) {
	if af.adminKeyFile == "" {
		return nil, nil
	}
	b, err := os.ReadFile(af.adminKeyFile)
	if err != nil {
		return nil, fmt.Errorf("--admin-key-file: %w", err)
	}
	keys, err := frontend.ParseAPIKeys(string(b))
	if err != nil {
		return nil, fmt.Errorf("--admin-key-file %s: %w", af.adminKeyFile, err)
	}
	return keys, nil
}

// isLoopbackListen reports whether a listen address binds only loopback.
func isLoopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// warnOpenListen prints one warning line when the API is reachable beyond
// this host with no API keys. A fleet token or TLS guards the workers, not
// the API, so neither silences it.
func warnOpenListen(log *slog.Logger, ff *frontendFlags) {
	if isLoopbackListen(ff.listen) || ff.auth.apiKeyFile != "" || os.Getenv(apiKeysEnv) != "" {
		return
	}
	why := "anyone who can reach it can use it"
	if ff.fleet.tokenFile != "" || ff.tls.cert != "" {
		why = "the fleet token and TLS guard the workers, not the API: anyone who can reach it can use it"
	}
	log.Warn("the API listens beyond loopback without API keys: "+why+" (set --api-key-file or "+apiKeysEnv+", or --listen 127.0.0.1:PORT)", "listen", ff.listen)
}

// warnInsecureNATS prints one warning line when serve's embedded NATS runs
// without authentication (--insecure-nats) where more than this host can
// reach it.
func warnInsecureNATS(log *slog.Logger, insecure bool, listen string) {
	if !insecure || isLoopbackListen(listen) {
		return
	}
	log.Warn("--insecure-nats: the embedded NATS server listens beyond loopback without authentication: anyone who can reach it can read the fleet's discovery and events and publish forged ones", "nats_listen", listen)
}

// fleetFlags are the credentials between kvmesh processes.
type fleetFlags struct {
	tokenFile string
	// generated is serve's own random token when none is configured, so
	// its in-process workers still answer only their own frontend.
	generated string
}

func (fl *fleetFlags) register(f *pflag.FlagSet) {
	f.StringVar(&fl.tokenFile, "fleet-token-file", "", "file holding the shared fleet token: the worker API and the control endpoints then serve only peers that present it (frontends, serve and workers must share it)")
}

// token reads the fleet token ("" when none is configured).
func (fl *fleetFlags) token() (string, error) {
	if fl.tokenFile == "" {
		return fl.generated, nil
	}
	b, err := os.ReadFile(fl.tokenFile)
	if err != nil {
		return "", fmt.Errorf("--fleet-token-file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	switch {
	case len(tok) < 16:
		return "", fmt.Errorf("--fleet-token-file %s: the token has %d characters, want at least 16", fl.tokenFile, len(tok))
	case strings.IndexFunc(tok, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0:
		return "", fmt.Errorf("--fleet-token-file %s: the token must be printable ASCII without spaces", fl.tokenFile)
	}
	return tok, nil
}

// tokenOrRandom is token, or when none is configured a random one that
// token returns from then on (serve: nothing outside the process holds it).
func (fl *fleetFlags) tokenOrRandom() (string, error) {
	tok, err := fl.token()
	if err != nil || tok != "" {
		return tok, err
	}
	var b [32]byte
	rand.Read(b[:])
	fl.generated = hex.EncodeToString(b[:])
	return fl.generated, nil
}
