// Package remote is the plumbing every adapter to a real engine shares
// (engine/vllm, engine/sglang, engine/trtllm): the configuration each
// adapter's own embeds, with its defaults (Config), the base every adapter
// embeds for its description, health, load readers, relay and Close (Base,
// Ranks for data-parallel servers), the KV-event relay from an engine's ZMQ
// publisher into the worker's event sink (Relay, over a Feed that the KVCR
// state agent shares), health
// gating, Prometheus /metrics scraping and the per-rank load read from it
// (RankLoad, Every), server-sent-event reading and the
// classification of HTTP failures into the request's fault (a 4xx, which
// reaches the client) or the engine's (engine.ErrUnavailable, which
// migrates the request).
//
// It imports engine, events and kv; it must not import worker, fleet,
// router or cmd: an adapter is a plain engine.Engine the worker drives.
package remote
