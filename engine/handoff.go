package engine

// HandoffStats counts the prefill and decode legs an engine served, for an
// engine that pins a prefill's blocks until its decode peer pulls them (the
// sim). Pinned* are gauges.
type HandoffStats struct {
	Prefills       uint64 // prefill legs answered with parameters
	FinalPrefills  uint64 // prefill legs whose one token was the whole answer
	PinnedHandoffs int64
	PinnedBlocks   int64
	Read, Expired  uint64 // pins released by a peer's read, by the expiry
	Released       uint64 // pins released by the decode side's release message

	Decodes    uint64 // decode legs
	Pulls      uint64 // decode legs that pulled (something was missing)
	PulledBlks uint64
	PullBytes  uint64
	PullNanos  uint64
	Failures   uint64 // pulls that failed (fewer blocks than the handoff named arrived)
	Recomputes uint64 // decode legs that recomputed some of the prompt (failures and bad or missing parameters)
	// ReleasesSent and ReleaseErrors count the decode side's release
	// messages and those that failed (the prefill side's TTL then frees
	// the pin).
	ReleasesSent, ReleaseErrors uint64
}

// Handoffs is implemented by an engine that counts its legs; the worker
// exports the counts.
type Handoffs interface {
	HandoffStats() HandoffStats
}
