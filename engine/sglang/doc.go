// Package sglang is the engine.Engine over one SGLang server
// (`python -m sglang.launch_server`): generation over its native
// POST /generate (input_ids, sampling_params, streamed, cumulative or
// incremental output_ids), meta_info mapped to kvmesh's usage and finish
// reasons, KV hints lowered to SGLang's request fields (kv_hints or the
// older kv_router_hint), disaggregated legs the SGLang way (the same
// request to a prefill and a decode server, paired by bootstrap_host,
// bootstrap_port and bootstrap_room), load from /metrics, /health gating,
// and KV events relayed from SGLang's ZMQ publisher (engine/remote.Relay;
// SGLang's hashes are signed 64-bit integers, carried bit for bit).
//
// It imports engine, engine/remote, hints and kv; it must not import
// worker, fleet, router, mockengine or cmd.
package sglang
