package hints

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
)

// Engine names the request form a hint is lowered into.
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

// Engines lists every lowering target.
var Engines = []Engine{VLLM, VLLMBridge, SGLang, TRTLLM}

// Request field names.
const (
	FieldKVHints             = "kv_hints"
	FieldKVTransferParams    = "kv_transfer_params"
	FieldDisaggregatedParams = "disaggregated_params"
	// KeyKVHint is the hint key inside kv_transfer_params (bridge form).
	KeyKVHint = "kv_hint"
	// KeyRouterHint is the older compact key inside kv_transfer_params
	// (payload only); read, stripped, never written.
	KeyRouterHint = "router_hint"
)

// sglangHandoffKeys are the SGLang bootstrap fields a decode leg receives.
var sglangHandoffKeys = []string{"bootstrap_host", "bootstrap_port", "bootstrap_room"}

// ErrDecodeLeg is returned by PrefillLeg for a request that already consumes
// prefill-produced KV: a hint is applied once, on the prefill leg.
var ErrDecodeLeg = errors.New("request is a decode handoff; KV hints apply on the prefill leg only")

// ParseEngine maps a name (as in flags) to an Engine.
func ParseEngine(s string) (Engine, error) {
	for _, e := range Engines {
		if string(e) == s {
			return e, nil
		}
	}
	return "", fmt.Errorf("unknown engine %q (want vllm, vllm-bridge, sglang or trtllm)", s)
}

// Encode returns env in engine's wire form (the value Lower places in the
// request). It does not validate env.
func Encode(engine Engine, env *Envelope) (json.RawMessage, error) {
	switch engine {
	case VLLM, VLLMBridge, TRTLLM:
		return env.Marshal(), nil
	case SGLang:
		return env.appendTo(nil, true), nil
	}
	return nil, fmt.Errorf("unknown engine %q", engine)
}

// Lower returns a copy of req carrying env in engine's form; env == nil
// removes any hint. Every hint location is cleared first, so a stale hint in
// another form never survives. req is never modified: maps that change are
// copied, untouched values are shared.
func Lower(engine Engine, req map[string]any, env *Envelope) (map[string]any, error) {
	var enc json.RawMessage
	if env != nil {
		var err error
		if enc, err = Encode(engine, env); err != nil {
			return nil, err
		}
	} else if _, err := ParseEngine(string(engine)); err != nil {
		return nil, err
	}
	out := maps.Clone(req)
	if out == nil {
		out = map[string]any{}
	}
	delete(out, FieldKVHints)
	if err := stripParamsHint(out); err != nil {
		return nil, err
	}
	if env == nil {
		return out, nil
	}
	if engine != VLLMBridge {
		out[FieldKVHints] = enc
		return out, nil
	}
	p, err := paramsMap(out[FieldKVTransferParams])
	if err != nil {
		return nil, err
	}
	if p == nil {
		p = map[string]any{}
	}
	p[KeyKVHint] = enc
	out[FieldKVTransferParams] = p
	return out, nil
}

// stripParamsHint replaces out's kv_transfer_params with a copy lacking the
// hint keys, if it holds any.
func stripParamsHint(out map[string]any) error {
	v, ok := out[FieldKVTransferParams]
	if !ok || v == nil {
		return nil
	}
	p, err := paramsMap(v)
	if err != nil {
		return err
	}
	_, a := p[KeyKVHint]
	_, b := p[KeyRouterHint]
	if a || b {
		delete(p, KeyKVHint)
		delete(p, KeyRouterHint)
		out[FieldKVTransferParams] = p
	}
	return nil
}

// paramsMap returns a fresh top-level copy of a kv_transfer_params value,
// which may be a decoded map or raw JSON (decoded with UseNumber so u64
// values stay exact). nil yields nil.
func paramsMap(v any) (map[string]any, error) {
	var raw []byte
	switch t := v.(type) {
	case nil:
		return nil, nil
	case map[string]any:
		return maps.Clone(t), nil
	case json.RawMessage:
		raw = t
	case []byte:
		raw = t
	default:
		return nil, &Error{FieldKVTransferParams, fmt.Sprintf("must be an object, got %T", v)}
	}
	if kind(raw) == "null" {
		return nil, nil
	}
	if kind(raw) != "object" {
		return nil, &Error{FieldKVTransferParams, "must be an object, got " + kind(raw)}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, &Error{FieldKVTransferParams, "invalid JSON: " + jsonErrText(err)}
	}
	return m, nil
}

// InstallConnectorParams returns a copy of extra (a request body or
// SamplingParams.extra_args) whose kv_transfer_params is REPLACED by a copy of
// params — never merged with what was there — with any kv_hint/router_hint
// inside removed: hints and connector metadata are separate concerns.
// params == nil removes kv_transfer_params. Other keys of extra are kept.
func InstallConnectorParams(extra, params map[string]any) map[string]any {
	out := maps.Clone(extra)
	if out == nil {
		out = map[string]any{}
	}
	if params == nil {
		delete(out, FieldKVTransferParams)
		return out
	}
	p := maps.Clone(params)
	delete(p, KeyKVHint)
	delete(p, KeyRouterHint)
	out[FieldKVTransferParams] = p
	return out
}

// IsDecodeHandoff reports whether req consumes KV produced by a prefill leg:
// vLLM kv_transfer_params.do_remote_prefill == true, or TensorRT-LLM
// disaggregated_params.request_type == "generation_only". SGLang's bootstrap
// fields are the same on both legs, so an SGLang body never reports true.
func IsDecodeHandoff(engine Engine, req map[string]any) bool {
	switch engine {
	case VLLM, VLLMBridge:
		p, err := paramsMap(req[FieldKVTransferParams])
		return err == nil && p["do_remote_prefill"] == true
	case TRTLLM:
		p, err := paramsMap(req[FieldDisaggregatedParams])
		return err == nil && p["request_type"] == "generation_only"
	}
	return false
}

// PrefillLeg lowers hint into an aggregated or prefill-leg request (also a
// decode worker that prefills locally under conditional disaggregation).
// It refuses (ErrDecodeLeg) a request that is a decode handoff.
func PrefillLeg(engine Engine, req map[string]any, hint *Envelope) (map[string]any, error) {
	if IsDecodeHandoff(engine, req) {
		return nil, ErrDecodeLeg
	}
	return Lower(engine, req, hint)
}

// DecodeLeg prepares a decode-leg request that consumes the prefill leg's
// handoff parameters: they are installed (replacing, never merging) into the
// engine's handoff field — kv_transfer_params for vLLM, disaggregated_params
// for TensorRT-LLM, the bootstrap_host/port/room fields for SGLang — and
// every hint is removed, so the prefill-side hint is never replayed.
func DecodeLeg(engine Engine, req map[string]any, handoff map[string]any) (map[string]any, error) {
	var out map[string]any
	switch engine {
	case VLLM, VLLMBridge:
		out = InstallConnectorParams(req, handoff)
	case TRTLLM:
		out = maps.Clone(req)
		if out == nil {
			out = map[string]any{}
		}
		delete(out, FieldDisaggregatedParams)
		if handoff != nil {
			p := maps.Clone(handoff)
			delete(p, KeyKVHint)
			out[FieldDisaggregatedParams] = p
		}
	case SGLang:
		out = maps.Clone(req)
		if out == nil {
			out = map[string]any{}
		}
		for _, k := range sglangHandoffKeys {
			delete(out, k)
		}
		for k, v := range handoff {
			if !isSGLangHandoffKey(k) {
				return nil, fmt.Errorf("sglang decode handoff: unexpected key %q (want bootstrap_host, bootstrap_port, bootstrap_room)", k)
			}
			out[k] = v
		}
	default:
		return nil, fmt.Errorf("unknown engine %q", engine)
	}
	return Lower(engine, out, nil)
}

func isSGLangHandoffKey(k string) bool {
	for _, h := range sglangHandoffKeys {
		if h == k {
			return true
		}
	}
	return false
}

// FromRequest reads back the hint a request body carries in engine's form:
// "kv_hints", or for the bridge kv_transfer_params.kv_hint (an envelope) or
// the older compact kv_transfer_params.router_hint (a bare kv.fetch payload).
// It returns (nil, nil) when there is none. A body decoded generically must
// have used json.Decoder.UseNumber, or large hashes will have lost precision.
func FromRequest(engine Engine, req map[string]any) (*Envelope, error) {
	if _, err := ParseEngine(string(engine)); err != nil {
		return nil, err
	}
	if engine != VLLMBridge {
		v, ok := req[FieldKVHints]
		if !ok || v == nil {
			return nil, nil
		}
		raw, err := rawJSON(FieldKVHints, v)
		if err != nil {
			return nil, err
		}
		return Parse(raw)
	}
	p, err := paramsMap(req[FieldKVTransferParams])
	if err != nil || p == nil {
		return nil, err
	}
	if v, ok := p[KeyKVHint]; ok && v != nil {
		raw, err := rawJSON(FieldKVTransferParams+"."+KeyKVHint, v)
		if err != nil {
			return nil, err
		}
		return Parse(raw)
	}
	if v, ok := p[KeyRouterHint]; ok && v != nil {
		raw, err := rawJSON(FieldKVTransferParams+"."+KeyRouterHint, v)
		if err != nil {
			return nil, err
		}
		return ParseCompact(raw)
	}
	return nil, nil
}

func rawJSON(path string, v any) ([]byte, error) {
	switch t := v.(type) {
	case json.RawMessage:
		return t, nil
	case []byte:
		return t, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, &Error{path, "cannot encode: " + jsonErrText(err)}
	}
	return b, nil
}

// ParseCompact accepts the older compact router_hint form — a bare kv.fetch
// payload {source_control_endpoint, block_hashes, …} — and wraps it into an
// envelope with an empty message_id and action "a1". Errors are named with
// the path "router_hint…".
func ParseCompact(payload []byte) (*Envelope, error) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		stats.malformed.Add(1)
		return nil, &Error{KeyRouterHint, "invalid JSON: " + jsonErrText(err)}
	}
	if _, err := dec.Token(); err != io.EOF {
		stats.malformed.Add(1)
		return nil, &Error{KeyRouterHint, "unexpected data after the JSON value"}
	}
	f, err := parseFetch(KeyRouterHint, raw)
	if err != nil {
		stats.malformed.Add(1)
		return nil, err
	}
	stats.legacyConverted.Add(1)
	return &Envelope{ProtocolVersion: ProtocolVersion, Actions: []Action{newFetchAction(FetchActionID, f)}}, nil
}
