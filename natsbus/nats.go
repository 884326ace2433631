package natsbus

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// EmbeddedConfig configures an in-process NATS server with JetStream.
type EmbeddedConfig struct {
	// Host to listen on; default 127.0.0.1.
	Host string
	// Port to listen on; 0 picks a free port.
	Port int
	// DataDir holds JetStream state; empty means a fresh temporary directory
	// that Shutdown removes.
	DataDir string
	// Logger receives the server's notices and errors; nil discards them.
	Logger *slog.Logger
	// FleetKey, when set, makes the server authenticate every client by
	// identity (fleetauth.go): workers and frontends with credentials
	// derived from this key, the owner with Admin. Nil: anyone connects
	// (tests, and serve --insecure-nats).
	FleetKey []byte
	// Admin is the owner's credential under FleetKey; nil draws one
	// (Embedded.Admin returns it).
	Admin *Credential
}

// Embedded is a running in-process NATS server.
type Embedded struct {
	srv     *server.Server
	dataDir string
	tempDir bool
	admin   *Credential
}

// StartEmbedded starts a NATS server with JetStream in this process and waits
// until it accepts connections.
func StartEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	host := cfg.Host
	if host == "" {
		host = "127.0.0.1"
	}
	port := cfg.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	if port < server.RANDOM_PORT || port > 65535 {
		return nil, fmt.Errorf("embedded nats: invalid port %d", cfg.Port)
	}
	dir, temp := cfg.DataDir, false
	if dir == "" {
		d, err := os.MkdirTemp("", "kvmesh-nats-")
		if err != nil {
			return nil, fmt.Errorf("embedded nats: data dir: %w", err)
		}
		dir, temp = d, true
	}
	opts := &server.Options{
		ServerName: "kvmesh-embedded",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   dir,
		NoSigs:     true,
		// No HTTP monitor, no cluster: a single loopback server.
		MaxPayload: 8 << 20,
	}
	admin := cfg.Admin
	if len(cfg.FleetKey) > 0 {
		if admin == nil {
			var err error
			if admin, err = NewAdminCredential(); err != nil {
				return nil, err
			}
		}
		opts.CustomClientAuthentication = &fleetAuth{key: cfg.FleetKey, admin: admin.public()}
		opts.AlwaysEnableNonce = true
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		if temp {
			os.RemoveAll(dir)
		}
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	if cfg.Logger != nil {
		srv.SetLoggerV2(&natsLogger{l: cfg.Logger}, false, false, false)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		srv.WaitForShutdown()
		if temp {
			os.RemoveAll(dir)
		}
		return nil, fmt.Errorf("embedded nats: not ready on %s within 10s", net.JoinHostPort(host, strconv.Itoa(cfg.Port)))
	}
	if len(cfg.FleetKey) == 0 {
		admin = nil
	}
	return &Embedded{srv: srv, dataDir: dir, tempDir: temp, admin: admin}, nil
}

// URL is the client URL, e.g. nats://127.0.0.1:4222.
func (e *Embedded) URL() string { return e.srv.ClientURL() }

// Port is the port the server listens on.
func (e *Embedded) Port() int {
	if a, ok := e.srv.Addr().(*net.TCPAddr); ok {
		return a.Port
	}
	return 0
}

// Admin is the owner's credential; nil when the server authenticates no one.
func (e *Embedded) Admin() *Credential { return e.admin }

// DataDir is where JetStream keeps its state.
func (e *Embedded) DataDir() string { return e.dataDir }

// Shutdown stops the server, waits for it, and removes a temporary data dir.
func (e *Embedded) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
	if e.tempDir {
		os.RemoveAll(e.dataDir)
	}
}

// natsLogger adapts slog to the nats-server logger interface.
type natsLogger struct{ l *slog.Logger }

func (n *natsLogger) Noticef(f string, a ...any) { n.l.Debug("nats: " + fmt.Sprintf(f, a...)) }
func (n *natsLogger) Warnf(f string, a ...any)   { n.l.Warn("nats: " + fmt.Sprintf(f, a...)) }
func (n *natsLogger) Fatalf(f string, a ...any)  { n.l.Error("nats: " + fmt.Sprintf(f, a...)) }
func (n *natsLogger) Errorf(f string, a ...any)  { n.l.Error("nats: " + fmt.Sprintf(f, a...)) }
func (n *natsLogger) Debugf(f string, a ...any)  { n.l.Debug("nats: " + fmt.Sprintf(f, a...)) }
func (n *natsLogger) Tracef(f string, a ...any)  {}

// ConnConfig configures a client connection.
type ConnConfig struct {
	// URLs is one or more comma-separated nats:// (or tls://) URLs.
	URLs string
	// Name identifies the connection in server monitoring.
	Name string
	// CredsFile is a NATS credentials (JWT + nkey seed) file.
	CredsFile string
	// Credential proves an identity to an embedded server with a fleet
	// key (fleetauth.go).
	Credential *Credential
	// CAFile, CertFile and KeyFile configure TLS: a CA to trust and an
	// optional client certificate.
	CAFile, CertFile, KeyFile string
	// ReconnectWait is the base delay between reconnect attempts (default
	// 250ms), growing to MaxReconnectWait (default 5s).
	ReconnectWait, MaxReconnectWait time.Duration
	// RetryOnFailedConnect makes Connect succeed while the server is still
	// unreachable; the connection keeps trying in the background.
	RetryOnFailedConnect bool
	Logger               *slog.Logger
}

// Connect opens a connection that reconnects forever with exponential
// backoff and buffers publishes while disconnected, so a brief NATS outage
// never ends a process.
func Connect(cfg ConnConfig) (*nats.Conn, error) {
	urls := strings.TrimSpace(cfg.URLs)
	if urls == "" {
		return nil, errors.New("nats: no server URL")
	}
	for _, u := range strings.Split(urls, ",") {
		u = strings.TrimSpace(u)
		if !strings.HasPrefix(u, "nats://") && !strings.HasPrefix(u, "tls://") && !strings.HasPrefix(u, "ws://") && !strings.HasPrefix(u, "wss://") {
			return nil, fmt.Errorf("nats: URL %q: want nats://, tls://, ws:// or wss://", u)
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	base, top := cfg.ReconnectWait, cfg.MaxReconnectWait
	if base <= 0 {
		base = 250 * time.Millisecond
	}
	if top <= 0 {
		top = 5 * time.Second
	}
	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectBufSize(16 << 20),
		nats.CustomReconnectDelay(func(attempts int) time.Duration {
			d := base
			for i := 1; i < attempts && d < top; i++ {
				d *= 2
			}
			return min(d, top)
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", "url", nc.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subj := ""
			if sub != nil {
				subj = sub.Subject
			}
			log.Warn("nats async error", "subject", subj, "err", err)
		}),
	}
	if cfg.RetryOnFailedConnect {
		opts = append(opts, nats.RetryOnFailedConnect(true))
	}
	if cfg.CredsFile != "" {
		if _, err := os.Stat(cfg.CredsFile); err != nil {
			return nil, fmt.Errorf("nats: credentials file: %w", err)
		}
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	var identity []nats.Option
	if c := cfg.Credential; c != nil {
		if cfg.CredsFile != "" {
			return nil, errors.New("nats: a credentials file and a fleet credential exclude each other")
		}
		identity = c.Options()
	}
	if cfg.CAFile != "" {
		opts = append(opts, nats.RootCAs(cfg.CAFile))
	}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, errors.New("nats: TLS client certificate needs both a cert and a key file")
	}
	if cfg.CertFile != "" {
		opts = append(opts, nats.ClientCert(cfg.CertFile, cfg.KeyFile))
	}
	nc, err := nats.Connect(urls, append(opts, identity...)...)
	if errors.Is(err, nats.ErrNkeysNotSupported) && identity != nil {
		// A server that authenticates no one sends no nonce to sign: the
		// fleet identity is only for kvmesh's embedded server, so join
		// without it. Discovery records stay signed either way.
		nc, err = nats.Connect(urls, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("nats: connect %s: %w", redactURLs(urls), err)
	}
	return nc, nil
}

// redactURLs hides the passwords of comma-separated URLs for messages.
func redactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			parts[i] = u.Redacted()
		}
	}
	return strings.Join(parts, ",")
}
