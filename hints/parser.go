package hints

import (
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
)

// Counters is a snapshot of a Parser's counts.
type Counters struct {
	// IgnoredVersion counts envelopes dropped for an unknown protocol_version.
	IgnoredVersion uint64
	// SkippedActions counts kv.fetch / kv.source_locations actions with an
	// unsupported action_version.
	SkippedActions uint64
	// Malformed counts envelopes rejected by validation (including mode "move").
	Malformed uint64
	// LegacyConverted counts kv.source_locations actions converted to kv.fetch.
	LegacyConverted uint64
}

// Parser parses the envelopes one consumer serves (a worker), counting
// what it drops or converts and logging each distinct unsupported version
// once. Its owner exports Counters as metrics; one Parser per consumer
// keeps the counts per worker. Safe for concurrent use.
type Parser struct {
	log *slog.Logger

	ignoredVersion, skippedActions, malformed, legacyConverted atomic.Uint64

	warnMu sync.Mutex
	warned map[string]struct{}
}

// NewParser returns a Parser that warns on log (nil: nowhere).
func NewParser(log *slog.Logger) *Parser {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Parser{log: log, warned: map[string]struct{}{}}
}

// Parse is the package's Parse, counted and logged.
func (p *Parser) Parse(data []byte) (*Envelope, error) {
	env, err := parse(data, p)
	switch {
	case errors.Is(err, ErrIgnored):
		p.ignoredVersion.Add(1)
	case err != nil:
		p.malformed.Add(1)
	}
	return env, err
}

// Counters returns the current counts.
func (p *Parser) Counters() Counters {
	return Counters{
		IgnoredVersion:  p.ignoredVersion.Load(),
		SkippedActions:  p.skippedActions.Load(),
		Malformed:       p.malformed.Load(),
		LegacyConverted: p.legacyConverted.Load(),
	}
}

// maxWarnKeys bounds the dedup set: hostile input with endless distinct
// versions must neither grow memory nor flood the log.
const maxWarnKeys = 64

// warnOnce logs msg the first time key is seen.
func (p *Parser) warnOnce(key, msg string, args ...any) {
	p.warnMu.Lock()
	_, dup := p.warned[key]
	full := len(p.warned) >= maxWarnKeys
	if !dup && !full {
		p.warned[key] = struct{}{}
	}
	p.warnMu.Unlock()
	if !dup && !full {
		p.log.Warn(msg, args...)
	}
}
