package kv

// FinishReason says why a generation ended. Its string is the worker API's
// finish_reason; the frontend maps it to OpenAI's at the HTTP edge.
type FinishReason string

const (
	FinishNone      FinishReason = ""
	FinishStop      FinishReason = "stop"   // a stop token or stop sequence
	FinishLength    FinishReason = "length" // max_tokens reached
	FinishCancelled FinishReason = "cancelled"
	FinishError     FinishReason = "error"
)
