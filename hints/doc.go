// Package hints is the KV hint envelope: the advisory message the router
// attaches to a booked request telling the chosen worker where it can pull a
// longer cached prefix from, instead of recomputing it.
//
// Wire shape (identical across Dynamo, vLLM, SGLang and the TensorRT-LLM RFC):
//
//	{"protocol_version":"0.1","message_id":"<selection id>","actions":[
//	  {"action_id":"a1","action_type":"kv.fetch","action_version":"1.0",
//	   "payload":{"source_control_endpoint":"tcp://10.0.0.7:23280","block_hashes":[11,22,33]}}]}
//
// Policy, chosen where the reference consumers disagree:
//   - an unknown protocol_version makes the whole hint ignored (ErrIgnored,
//     counted, warned once per received value);
//   - a kv.fetch with an action_version other than "1.0" is skipped: it is not
//     interpreted (Fetch never returns it) but it is carried opaquely like any
//     unknown action, so a newer consumer downstream can still use it;
//   - the legacy action type kv.source_locations is accepted and converted to
//     kv.fetch; it is never emitted (an unknown-version legacy action is dropped);
//   - unknown actions round-trip byte for byte;
//   - action_id, action_type and action_version that are JSON numbers are
//     read as Python's str() of them ("123", "1.0"), as vLLM's envelope
//     builder does; objects, lists, booleans and null are rejected;
//   - anything else malformed is rejected with one precise error naming the
//     field (*Error, errors.Is(err, ErrMalformed)).
//
// Inside kvmesh a hint is the typed kv.Hint (the router plans it, the worker
// API carries it as a protobuf message, engine.Request holds it); the
// envelope exists only at the edge to an engine that reads JSON. FromHint
// lowers a kv.Hint to an envelope, Envelope.Hint reads one back (the worker
// API's legacy kv_hint field), and CheckHint validates a kv.Hint where it
// enters a worker with the envelope's rules.
//
// Hints are advisory: callers on the worker side drop a hint that fails to
// parse and serve the request without it.
//
// Encode gives an envelope in the wire form of one engine (Engine): the
// bytes are the same for all of them except that SGLang's form writes every
// fetch payload's "mode":"copy" explicitly. Where the form goes is the
// adapter's business, in its own typed request body:
//
//	vllm         body.kv_hints = envelope                  (vLLM native surface)
//	vllm-bridge  body.kv_transfer_params.kv_hint = envelope (older merged path)
//	sglang       body.kv_hints = envelope, fetch payloads with explicit "mode":"copy"
//	trtllm       body.kv_hints = envelope                  (RFC: GenerationRequest.kv_hints)
//
// The trtllm form is the RFC's, for `kvmesh hints validate` and a server
// that implements it: the TensorRT-LLM adapter itself takes only hint form
// off, so no TensorRT-LLM engine is sent a hint today.
//
// Prefill/decode: only the prefill (or aggregated) leg carries a hint; the
// worker (worker/leg.go) strips KeyKVHint/KeyRouterHint from a decode leg's
// connector parameters, and the adapters never put one on a decode leg.
// The package does no I/O.
//
// It imports only kv: the worker and the engine adapters use it, the router
// does not need it (its hints are typed kv.Hint values).
package hints
