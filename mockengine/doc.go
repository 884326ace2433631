// Package mockengine runs kvmesh's simulated engine (engine/sim: its
// scheduler, KV pool, timing model and real block bytes) behind the network
// surfaces of real inference engines, so kvmesh's adapters and users' own
// stacks can be tested end to end without GPUs.
//
// VLLM is the vLLM stand-in: OpenAI completions and chat over HTTP with
// vLLM's extra fields (return_token_ids, cache_salt, kv_transfer_params,
// kv_hints), /v1/models, /health, /version, /metrics with vLLM's metric
// names, KV events on vLLM's ZMQ wire (package events) and the
// NixlConnector's P/D contract with real block ids, a real pull of the
// blocks' bytes over a side channel, and the consumers' notification that
// frees them.
//
// TRTLLM is the TensorRT-LLM stand-in: trtllm-serve's completions and chat
// (its CompletionRequest fields only, its flat error shape), /metrics as
// JSON iteration stats, KV events drained by POST /kv_cache_events from a
// bounded buffer, context_only/generation_only disaggregation whose
// encoded_opaque_state names leased blocks the generation side pulls over
// the same side channel, and the sim's KVBM behind the context side; it
// reads trtllm-serve's LLM API options YAML.
//
// SGLang is the SGLang stand-in, built on the vLLM one's engine and
// machinery: /generate (cumulative or incremental output_ids, meta_info),
// /get_server_info, /get_model_info, /metrics with SGLang's names, KV
// events in SGLang's shape (events.ShapeSGLang: signed hashes, no DP rank)
// and P/D by bootstrap room: the prefill leases the room's blocks and
// answers the decode's lookup on its side channel (LookupRoom), the decode
// pulls them and notifies.
//
// Shared pieces of the three stand-ins: the core each embeds (core.go:
// the sim's set-up, tokenizer and stop tokens, the context bound, the
// producer's leases and side channels, the consumer's pulls and
// notifications), SideChannel (a port that serves leased blocks by pool id
// through package transfer and takes "request_id:consumers"
// notifications), Leases (blocks pinned for a peer, freed on notification
// or when the lease runs out), RankPublishers (one vLLM-wire publisher per
// DP rank, with the engine-hash mapping), the per-rank metric figures
// (metrics.go) and the OpenAI request, response, error and SSE helpers.
//
// It imports engine/sim, events, transfer, hints, tokenizer and kv; it must
// not import frontend, worker, router, the fleet layer or cmd: it stands
// where a real engine would, outside kvmesh.
package mockengine
