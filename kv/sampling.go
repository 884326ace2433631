package kv

// Sampling is how one generation samples and when it stops. The same value
// travels from the frontend over the worker API (api.SamplingToProto and
// SamplingFromProto, which also check its ranges) to the engine: adding a
// parameter touches this struct, that conversion and the engines that
// honour it.
type Sampling struct {
	MaxTokens int // tokens to generate (≥ 1 at the engine)
	// MinTokens is the fewest tokens generated: StopTokens are not honoured
	// before it (vLLM's min_tokens); 0 ≤ MinTokens ≤ MaxTokens.
	MinTokens int
	// IgnoreEOS generates up to MaxTokens whatever the model emits (vLLM's
	// ignore_eos): StopTokens, the model's end-of-sequence ids, are not
	// honoured at all.
	IgnoreEOS   bool
	StopTokens  []Token // generation ends after emitting one of these
	Seed        uint64
	Temperature float64 // ≥ 0; 0 is greedy
	// TopP is the nucleus sampling mass in (0, 1]; 0 means not set, so the
	// engine's default (1) applies: no client can ask for 0.
	TopP float64
	// PresencePenalty and FrequencyPenalty are OpenAI's, in [-2, 2]; 0
	// applies none (every engine's default).
	PresencePenalty  float64
	FrequencyPenalty float64
}
