package vllm

import (
	"testing"

	"github.com/kvmesh/kvmesh/engine/enginetest"
)

// frames are streamed completions frames as vLLM writes them, and the
// corners DecodeFrame must either answer as encoding/json does or decline.
var frames = []string{
	`{"id":"cmpl-1","object":"text_completion","created":1733000000,"model":"m","choices":[{"index":0,"text":" the","logprobs":null,"finish_reason":null,"stop_reason":null,"token_ids":[279],"prompt_token_ids":null}],"usage":null}`,
	`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":[]}],"usage":null}`,
	`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":14000,"total_tokens":14008,"completion_tokens":8,"prompt_tokens_details":{"cached_tokens":512}}}`,
	`{"choices":[{"text":"a\"b\\n\u00e9","token_ids":[1,2,4294967295],"finish_reason":"stop"}],"kv_transfer_params":{"do_remote_decode":true,"remote_block_ids":[1,2]}}`,
	`{"choices":[{"text":"é ü","token_ids":[0]}],"error":null}`,
	`{"error":{"message":"boom","code":400}}`,
	`{"choices":null,"kv_transfer_params":null}`,
	` { "choices" : [ { "token_ids" : [ 5 , 6 ] , "text" : null } ] } `,
	`{"choices":[{"token_ids":null,"text":"x"}]}`,
	`{"x":[1.5e-3,-0,true,false,null,{"y":"z"},[]],"choices":[{"token_ids":[7]}]}`,
	// Declined or refused by encoding/json as well:
	`{"Choices":[{"token_ids":[1]}]}`,
	`{"choices":[{"TOKEN_IDS":[1]}]}`,
	`{"choices":[{"token_ids":[1]}],"choices":[{"text":"x"}]}`,
	`{"choices":[{"token_ids":[1.0]}]}`,
	`{"choices":[{"token_ids":[-1]}]}`,
	`{"choices":[{"token_ids":[4294967296]}]}`,
	`{"choices":[{"token_ids":[01]}]}`,
	`{"choices":[{"text":5}]}`,
	`{"choices":[null]}`,
	`{"ch\u006fices":[{"token_ids":[1]}]}`,
	`{"choices":[{"token_ids":[1]}]} x`,
	`{"choices":[{"token_ids":[1]}]`,
	`{"x":01}`,
	`{"x":"a\qb"}`,
	`{"x":"tab	in"}`,
	`{"usage":{"prompt_tokens":"many"}}`,
	`null`,
	`[]`,
	``,
}

// TestDecodeFrameMatchesJSON: whatever DecodeFrame takes, encoding/json
// decodes to the same value.
func TestDecodeFrameMatchesJSON(t *testing.T) {
	enginetest.CheckFrames[response](t, frames, 10)
}

func FuzzDecodeFrame(f *testing.F) {
	enginetest.FuzzFrames[response](f, frames)
}

// BenchmarkStreamFrame: one token's frame, decoded as ReadFrames does.
func BenchmarkStreamFrame(b *testing.B) {
	enginetest.BenchFrame[response](b, []byte(frames[0]))
}
