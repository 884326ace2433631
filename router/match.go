package router

import (
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// Match is one worker's overlap with a request, as the index reports it.
// Depth[t] is the number of leading query blocks the worker holds on tier t
// or a faster one (cumulative), so Depth[TierDevice] ≤ … ≤ Depth[TierExternal].
//
// It mirrors index.Match field for field; when the index package lands this
// becomes an alias of it.
type Match struct {
	Worker kv.WorkerKey
	Depth  [kv.NumTiers]uint32
}

// Matcher answers "who holds how much of this prefix". It appends one Match
// per worker with a non-zero deepest-tier depth to dst, in ascending worker
// key order, and must be safe for concurrent use (the index is fed events
// while the router reads it).
type Matcher interface {
	FindMatches(local []kv.LocalHash, dst []Match) []Match
}

// ApproxIndex is the index of kv-approx mode: the router inserts each routed
// request's blocks under the chosen worker and they expire after a TTL.
// The router serialises its own calls to it.
type ApproxIndex interface {
	Matcher
	Insert(w kv.WorkerKey, local []kv.LocalHash, now time.Time)
}
