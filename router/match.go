package router

import (
	"time"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/kv"
)

// Match is one worker's overlap with a request, as the index reports it.
// Depth[t] is the number of leading query blocks the worker holds on tier t
// or a faster one (cumulative), so Depth[TierDevice] ≤ … ≤ Depth[TierExternal].
type Match = index.Match

// Matcher answers "who holds how much of this prefix" (*index.Index). It
// appends one Match per worker with a non-zero deepest-tier depth to dst, in
// ascending worker key order, and must be safe for concurrent use (the index
// is fed events while the router reads it).
type Matcher interface {
	FindMatches(local []kv.LocalHash, dst []Match) []Match
}

// EngineHasher is what hint planning needs of the Matcher (*index.Index has
// it): the engine hashes worker w stored the leading blocks of a query under,
// appended to dst, stopping at the first block w does not hold. A hint must
// name the source's blocks in its own hash domain.
type EngineHasher interface {
	EngineHashes(w kv.WorkerKey, local []kv.LocalHash, dst []kv.EngineHash) []kv.EngineHash
}

// ApproxIndex is the index of kv-approx mode (*index.Approx): the router
// inserts each routed request's blocks under the chosen worker and they
// expire after a TTL. It must be safe for concurrent use. If it also has
// Expire(now) the router calls it before each lookup, so expiry follows the
// injected clock exactly; if it has RemoveWorker(w) the router calls it when
// a worker leaves.
type ApproxIndex interface {
	Matcher
	Insert(w kv.WorkerKey, local []kv.LocalHash, now time.Time)
}

type approxExpirer interface{ Expire(now time.Time) }

// approxSeqInserter is an ApproxIndex that takes the sequence hashes of
// local too (kv.SeqHashes of it), which the router has, so it need not
// chain them again.
type approxSeqInserter interface {
	InsertSeq(w kv.WorkerKey, local []kv.LocalHash, seq []kv.SeqHash, now time.Time)
}

type approxRemover interface{ RemoveWorker(w kv.WorkerKey) }

// DefaultApprox builds the index package's approximate index with the
// default capacity (Config.NewApprox's default).
func DefaultApprox(ttl time.Duration) ApproxIndex { return index.NewApprox(ttl, 0) }
