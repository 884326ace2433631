// Package trtllm is the engine.Engine over one `trtllm-serve`: generation
// over POST /v1/completions (token-id prompts, detokenize off so answers
// carry token_ids, streamed with usage), disaggregated legs with
// TensorRT-LLM's disaggregated_params (context_only answers whose
// parameters, unchanged, and prompt_token_ids feed a generation_only leg),
// load from /metrics' JSON iteration stats, /health gating, and KV events
// polled from POST /kv_cache_events into the worker's sink.
//
// TensorRT-LLM's OpenAI protocol refuses unknown fields, so nothing it does
// not define is ever sent: no KV hints (its requests have no hint field),
// no cache salt, no LoRA by name; a request that needs one is refused with
// a message saying so.
//
// It imports engine, engine/remote and kv; it must not import worker,
// fleet, router, mockengine or cmd.
package trtllm
