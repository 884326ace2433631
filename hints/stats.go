package hints

import (
	"log/slog"
	"sync"
	"sync/atomic"
)

// Counters is a snapshot of the package's parse counters (process-wide;
// exported to Prometheus by the wiring that owns the registry).
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

var stats struct {
	ignoredVersion, skippedActions, malformed, legacyConverted atomic.Uint64
}

// Stats returns the current counters.
func Stats() Counters {
	return Counters{
		IgnoredVersion:  stats.ignoredVersion.Load(),
		SkippedActions:  stats.skippedActions.Load(),
		Malformed:       stats.malformed.Load(),
		LegacyConverted: stats.legacyConverted.Load(),
	}
}

// maxWarnKeys bounds the dedup set: hostile input with endless distinct
// versions must neither grow memory nor flood the log.
const maxWarnKeys = 64

var warned struct {
	sync.Mutex
	seen map[string]struct{}
}

// warnOnce logs msg the first time key is seen.
func warnOnce(key, msg string, args ...any) {
	warned.Lock()
	if warned.seen == nil {
		warned.seen = make(map[string]struct{})
	}
	_, dup := warned.seen[key]
	full := len(warned.seen) >= maxWarnKeys
	if !dup && !full {
		warned.seen[key] = struct{}{}
	}
	warned.Unlock()
	if !dup && !full {
		slog.Warn(msg, args...)
	}
}
