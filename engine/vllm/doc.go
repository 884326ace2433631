// Package vllm is the engine.Engine over one `vllm serve`: generation over
// POST /v1/completions (token-id prompts, streamed, return_token_ids),
// KV hints lowered to vLLM's request forms (package hints), disaggregated
// legs with vLLM's NixlConnector kv_transfer_params, load from /metrics,
// /health gating, and KV events relayed from vLLM's ZMQ publisher
// (engine/remote.Relay).
//
// It imports engine, engine/remote, hints and kv; it must not
// import worker, fleet, router, mockengine or cmd.
package vllm
