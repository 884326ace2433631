package hints

import (
	"encoding/json"
	"fmt"
)

// Engine names the wire form an engine reads the envelope in.
type Engine string

const (
	// VLLM is vLLM's native surface (vLLM PR #53423): the envelope is the
	// top-level "kv_hints" field of the generate request.
	VLLM Engine = "vllm"
	// VLLMBridge is the older merged path: the envelope rides inside the
	// connector metadata as kv_transfer_params.kv_hint.
	VLLMBridge Engine = "vllm-bridge"
	// SGLang: top-level "kv_hints" on GenerateReqInput; interpreted fetch
	// payloads re-emitted with an explicit "mode":"copy" (hashes are always
	// unsigned integers).
	SGLang Engine = "sglang"
	// TRTLLM: the envelope on the generation request as "kv_hints"
	// (TensorRT-LLM RFC #18153: GenerationRequest.kv_hints).
	TRTLLM Engine = "trtllm"
)

// Engines lists every wire form (a fresh slice: the package keeps no
// state a caller could change).
func Engines() []Engine { return []Engine{VLLM, VLLMBridge, SGLang, TRTLLM} }

// Keys inside kv_transfer_params (vLLM connector metadata).
const (
	// KeyKVHint carries the envelope in the bridge form.
	KeyKVHint = "kv_hint"
	// KeyRouterHint is the older compact form (payload only): never
	// written; a worker strips it from connector parameters like KeyKVHint.
	KeyRouterHint = "router_hint"
)

// ParseEngine maps a name (as in flags) to an Engine.
func ParseEngine(s string) (Engine, error) {
	for _, e := range Engines() {
		if string(e) == s {
			return e, nil
		}
	}
	return "", fmt.Errorf("unknown engine %q (want vllm, vllm-bridge, sglang or trtllm)", s)
}

// Encode returns env in engine's wire form: the value an adapter places at
// the field that engine reads. It does not validate env.
func Encode(engine Engine, env *Envelope) (json.RawMessage, error) {
	switch engine {
	case VLLM, VLLMBridge, TRTLLM:
		return env.Marshal(), nil
	case SGLang:
		return env.appendTo(nil, true), nil
	}
	return nil, fmt.Errorf("unknown engine %q", engine)
}
