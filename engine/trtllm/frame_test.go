package trtllm

import (
	"testing"

	"github.com/kvmesh/kvmesh/engine/enginetest"
)

// frames are streamed /generate frames as TensorRT-LLM writes them, and corners
// DecodeFrame must answer as encoding/json does or decline.
var frames = []string{
	`{"id":"cmpl-1","object":"text_completion","created":1733000000,"model":"m","choices":[{"index":0,"text":" the","token_ids":[279],"logprobs":null,"context_logits":null,"finish_reason":null,"stop_reason":null,"disaggregated_params":null}],"usage":null,"prompt_token_ids":null}`,
	`{"object":"text_completion","choices":[{"index":0,"text":"","token_ids":[],"finish_reason":"length","disaggregated_params":{"request_type":"context_only","first_gen_tokens":[5],"ctx_request_id":7}}],"usage":{"prompt_tokens":14000,"completion_tokens":8,"total_tokens":14008,"prompt_tokens_details":{"cached_tokens":512}},"prompt_token_ids":[1,2,3]}`,
	`{"object":"error","message":"bad \"thing\"","code":null,"error":null,"choices":null}`,
	`{"choices":[{"text":null,"token_ids":null,"finish_reason":null}],"usage":null,"extra":[{"a":-1.5E+2}]}`,
	// Declined or refused by encoding/json as well:
	`{"object":"error","message":"x","type":"BadRequestError","param":null,"code":400}`,
	`{"Choices":[]}`,
	`{"choices":[{"Token_ids":[1]}]}`,
	`{"choices":[{"token_ids":[1],"token_ids":[2]}]}`,
	`{"usage":{"prompt_tokens":1.5}}`,
	`{"choices":[{"finish_reason":7}]}`,
	`{"choices":{}}`,
	`{"choices":[]`,
	`[]`,
}

func TestDecodeFrameMatchesJSON(t *testing.T) {
	enginetest.CheckFrames[response](t, frames, 4)
}

func FuzzDecodeFrame(f *testing.F) {
	enginetest.FuzzFrames[response](f, frames)
}

// BenchmarkStreamFrame: one token's frame, decoded as ReadFrames does.
func BenchmarkStreamFrame(b *testing.B) {
	enginetest.BenchFrame[response](b, []byte(frames[0]))
}
