package remote

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"
)

// HealthConfig configures a HealthMonitor.
type HealthConfig struct {
	URL string // the engine's health route, e.g. http://host:port/health
	// Interval between checks; each check may take as long. Default
	// DefaultHealthInterval.
	Interval time.Duration
	// Failures is how many checks in a row must fail (error, timeout or a
	// non-200) before the engine is unhealthy, so one slow answer under
	// load does not take a worker out of service; default 2. One good
	// answer makes it healthy again.
	Failures int
	Client   *http.Client
	Logger   *slog.Logger
}

// DefaultHealthInterval is HealthConfig.Interval's default.
const DefaultHealthInterval = time.Second

// HealthMonitor polls an engine's health route after start (the adapter
// waited for it to be healthy first) and implements engine.Health.
type HealthMonitor struct {
	cfg HealthConfig
	log *slog.Logger

	mu      sync.Mutex
	healthy bool
	changed chan struct{}
	downs   uint64

	cancel context.CancelFunc
	done   chan struct{}
}

// NewHealthMonitor starts polling; the engine is taken as healthy.
func NewHealthMonitor(cfg HealthConfig) *HealthMonitor {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultHealthInterval
	}
	if cfg.Failures <= 0 {
		cfg.Failures = 2
	}
	if cfg.Client == nil {
		cfg.Client = http.DefaultClient
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &HealthMonitor{cfg: cfg, log: cfg.Logger, healthy: true, changed: make(chan struct{}), cancel: cancel, done: make(chan struct{})}
	go m.run(ctx)
	return m
}

func (m *HealthMonitor) run(ctx context.Context) {
	defer close(m.done)
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	failed := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := m.check(ctx)
		if ctx.Err() != nil {
			return
		}
		switch {
		case err == nil:
			failed = 0
			m.set(true, nil)
		default:
			if failed++; failed >= m.cfg.Failures {
				m.set(false, err)
			}
		}
	}
}

func (m *HealthMonitor) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Interval)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.cfg.URL, nil)
	if err != nil {
		return err
	}
	resp, err := m.cfg.Client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return &httpStatusError{resp.Status}
	}
	return nil
}

type httpStatusError struct{ status string }

func (e *httpStatusError) Error() string { return e.status }

// set records a verdict; a change wakes the watchers. The watcher (the
// worker) logs the transition; the cause is logged here at debug level.
func (m *HealthMonitor) set(healthy bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.healthy == healthy {
		return
	}
	m.healthy = healthy
	if !healthy {
		m.downs++
		m.log.Debug("engine health check failing", "url", m.cfg.URL, "checks", m.cfg.Failures, "err", err)
	}
	close(m.changed)
	m.changed = make(chan struct{})
}

// Health is the latest verdict and a channel closed at its next change.
func (m *HealthMonitor) Health() (bool, <-chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.healthy, m.changed
}

// Downs counts transitions to unhealthy.
func (m *HealthMonitor) Downs() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.downs
}

// Close stops polling and wakes the watchers.
func (m *HealthMonitor) Close() {
	m.cancel()
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	select {
	case <-m.changed:
	default:
		close(m.changed)
	}
}
