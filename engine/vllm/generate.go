package vllm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/remote"
	"github.com/kvmesh/kvmesh/hints"
	"github.com/kvmesh/kvmesh/internal/stages"
	"github.com/kvmesh/kvmesh/kv"
)

// completionRequest is the body of POST /v1/completions. Fields left at
// their zero value are omitted, so vLLM applies its own defaults.
type completionRequest struct {
	Model            string                `json:"model"`
	Prompt           []kv.Token            `json:"-"` // written first by remote.JSONWithTokens
	MaxTokens        int                   `json:"max_tokens"`
	Stream           bool                  `json:"stream"`
	StreamOptions    *remote.StreamOptions `json:"stream_options,omitempty"`
	ReturnTokenIDs   bool                  `json:"return_token_ids"`
	Temperature      float64               `json:"temperature"`
	TopP             float64               `json:"top_p,omitempty"`
	Seed             *int64                `json:"seed,omitempty"`
	PresencePenalty  float64               `json:"presence_penalty,omitempty"`
	FrequencyPenalty float64               `json:"frequency_penalty,omitempty"`
	StopTokenIDs     []kv.Token            `json:"stop_token_ids,omitempty"`
	MinTokens        int                   `json:"min_tokens,omitempty"`
	IgnoreEOS        bool                  `json:"ignore_eos,omitempty"`
	CacheSalt        string                `json:"cache_salt,omitempty"`
	KVHints          json.RawMessage       `json:"kv_hints,omitempty"`
	KVTransferParams json.RawMessage       `json:"kv_transfer_params,omitempty"`
}

type choice struct {
	TokenIDs     []kv.Token `json:"token_ids"`
	Text         string     `json:"text"`
	FinishReason *string    `json:"finish_reason"`
}

// response is a streamed chunk or a whole response.
type response struct {
	Choices          []choice        `json:"choices"`
	Usage            *remote.Usage   `json:"usage"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	Error            json.RawMessage `json:"error"`
}

// prefillParams opens a NixlConnector prefill: keep the blocks for a remote
// decode. The remote_* keys are spelled out as null, as vLLM's own P/D
// proxies send them.
const prefillParams = `"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null`

// body builds the request for req's leg.
func (e *Engine) body(req *engine.Request) (*completionRequest, error) {
	b := &completionRequest{Model: e.cfg.Model, Prompt: req.Tokens, MaxTokens: req.MaxTokens, Stream: true,
		StreamOptions: &remote.StreamOptions{IncludeUsage: true}, ReturnTokenIDs: true, Temperature: req.Temperature,
		TopP: req.TopP, PresencePenalty: req.PresencePenalty, FrequencyPenalty: req.FrequencyPenalty,
		StopTokenIDs: req.StopTokens, MinTokens: req.MinTokens, IgnoreEOS: req.IgnoreEOS, CacheSalt: req.CacheSalt}
	if req.LoRA != "" {
		b.Model = req.LoRA // vLLM serves a LoRA adapter under its own model name
	}
	seed := int64(req.Seed) // vLLM's seed is a signed 64-bit integer
	b.Seed = &seed
	var hint json.RawMessage
	if req.KVHint != nil && req.Leg != kv.LegDecode && e.cfg.HintForm != remote.HintOff {
		hint = hints.FromHint(req.KVHint).Marshal()
	}
	if hint != nil && e.cfg.HintForm == remote.HintNative {
		b.KVHints = hint
	}
	bridge := func(params string) json.RawMessage {
		if hint != nil && e.cfg.HintForm == remote.HintBridge {
			if params != "" {
				params += ","
			}
			params += `"` + hints.KeyKVHint + `":` + string(hint)
		}
		if params == "" {
			return nil
		}
		return json.RawMessage("{" + params + "}")
	}
	switch req.Leg {
	case kv.LegWhole:
		b.KVTransferParams = bridge("")
	case kv.LegPrefill:
		// One token, whole: the answer carries the connector's parameters.
		// min_tokens is held back for the decode leg, so nothing holds the
		// prefill past its one token.
		b.Stream, b.StreamOptions, b.MaxTokens, b.MinTokens = false, nil, 1, 0
		b.KVTransferParams = bridge(prefillParams)
	case kv.LegDecode:
		if len(req.TransferParams) > 0 {
			p := bytes.TrimSpace(req.TransferParams)
			if len(p) == 0 || p[0] != '{' || !json.Valid(p) {
				return nil, errors.New("kv_transfer_params of a decode leg must be a JSON object")
			}
			b.KVTransferParams = req.TransferParams // whole and unchanged
		}
	default:
		return nil, fmt.Errorf("unknown leg %v", req.Leg)
	}
	return b, nil
}

// Generate posts the request and streams its tokens. A 4xx is returned
// as the request's error (*remote.RejectedError); a refused connection, a
// 5xx or a stream cut short wraps engine.ErrUnavailable, so the request
// migrates.
func (e *Engine) Generate(ctx context.Context, req *engine.Request) (<-chan engine.Chunk, error) {
	if e.Closed() {
		return nil, engine.ErrClosed
	}
	if req.DPRank < 0 || req.DPRank >= e.cfg.DPSize {
		return nil, fmt.Errorf("dp rank %d but the engine runs %d", req.DPRank, e.cfg.DPSize)
	}
	if req.MaxTokens < 1 {
		return nil, errors.New("max_tokens must be at least 1")
	}
	b, err := e.body(req)
	if err != nil {
		return nil, err
	}
	payload, err := remote.JSONWithTokens("prompt", b.Prompt, b)
	if err != nil {
		return nil, err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, e.cfg.URL+"/v1/completions", bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Content-Type", "application/json")
	if req.ID != "" {
		hr.Header.Set("X-Request-Id", req.ID)
	}
	if e.cfg.DPSize > 1 {
		hr.Header.Set("X-data-parallel-rank", strconv.Itoa(req.DPRank))
	}
	clk := stages.From(ctx)
	clk.Mark(stages.AdapterBuild)
	resp, err := e.Client().Do(hr)
	clk.Mark(stages.EngineConnect)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, remote.Lost(err)
	}
	if resp.StatusCode/100 != 2 {
		return nil, remote.ResponseError(resp)
	}
	ch := make(chan engine.Chunk, 16)
	go func() {
		defer close(ch)
		defer resp.Body.Close()
		if b.Stream {
			e.readStream(ctx, resp.Body, len(req.Tokens), ch)
		} else {
			e.readWhole(ctx, resp.Body, req.Leg, ch)
		}
	}()
	return ch, nil
}

// finish maps vLLM's finish_reason; ok is false for "abort" (the engine
// dropped the request: another worker may finish it).
func finish(s string) (kv.FinishReason, bool) {
	switch s {
	case "length":
		return kv.FinishLength, true
	case "abort":
		return kv.FinishError, false
	}
	return kv.FinishStop, true
}

func (e *Engine) readStream(ctx context.Context, body io.Reader, promptLen int, ch chan<- engine.Chunk) {
	var (
		fin     kv.FinishReason
		pending []kv.Token // the finishing chunk's tokens, sent with the usage
		u       *engine.Usage
		n       int
	)
	// return_token_ids makes vLLM echo the prompt's ids in its first
	// frame; nothing here reads them.
	err := remote.ReadFramesDropping(ctx, body, "prompt_token_ids", func() bool { return fin != kv.FinishNone }, func(r *response) error {
		if len(r.Error) > 0 && string(r.Error) != "null" {
			return remote.StreamError(r.Error)
		}
		if r.Usage != nil {
			u = r.Usage.Engine()
		}
		if len(r.Choices) == 0 {
			return nil
		}
		c := r.Choices[0]
		if c.TokenIDs == nil && c.Text != "" {
			return errors.New("vLLM returned text without token_ids: it needs return_token_ids support (vLLM 0.10.2 or later)")
		}
		n += len(c.TokenIDs)
		if c.FinishReason != nil {
			f, ok := finish(*c.FinishReason)
			if !ok {
				return remote.Lost(fmt.Errorf("engine aborted the request (finish_reason %q)", *c.FinishReason))
			}
			fin, pending = f, c.TokenIDs
			return nil
		}
		if len(c.TokenIDs) > 0 && !remote.Send(ctx, ch, engine.Chunk{Tokens: c.TokenIDs}) {
			return remote.ErrStopped
		}
		return nil
	})
	if !remote.StreamEnded(ctx, ch, err, fin) {
		return
	}
	if u == nil {
		u = &engine.Usage{PromptTokens: promptLen, CompletionTokens: n}
	}
	remote.Send(ctx, ch, engine.Chunk{Tokens: pending, Finish: fin, Usage: u})
}

// readWhole reads a non-streamed answer (a prefill leg).
func (e *Engine) readWhole(ctx context.Context, body io.Reader, leg kv.Leg, ch chan<- engine.Chunk) {
	var r response
	if err := json.NewDecoder(body).Decode(&r); err != nil {
		if ctx.Err() == nil {
			remote.Send(ctx, ch, engine.Chunk{Err: remote.Lost(fmt.Errorf("bad response: %v", err)), Finish: kv.FinishError})
		}
		return
	}
	if len(r.Choices) == 0 || r.Choices[0].FinishReason == nil {
		remote.Send(ctx, ch, engine.Chunk{Err: remote.Lost(errNoChoice), Finish: kv.FinishError})
		return
	}
	c := r.Choices[0]
	f, ok := finish(*c.FinishReason)
	if !ok {
		remote.Send(ctx, ch, engine.Chunk{Err: remote.Lost(fmt.Errorf("engine aborted the request (finish_reason %q)", *c.FinishReason)), Finish: kv.FinishError})
		return
	}
	out := engine.Chunk{Tokens: c.TokenIDs, Finish: f}
	if r.Usage != nil {
		out.Usage = r.Usage.Engine()
	} else {
		out.Usage = &engine.Usage{CompletionTokens: len(c.TokenIDs)}
	}
	// Only a prefill cut by its one-token budget continues on a decode
	// engine; one that stopped (EOS, a stop token) is final, and so is one
	// the connector gave no parameters for, unless the connector never
	// gives any (shared storage).
	if leg == kv.LegPrefill && f == kv.FinishLength {
		if p := bytes.TrimSpace(r.KVTransferParams); len(p) > 0 && string(p) != "null" {
			out.TransferParams = append([]byte(nil), r.KVTransferParams...)
		} else if e.cfg.Transfer == TransferSharedStorage {
			out.TransferParams = []byte(SharedStorageParams)
		}
	}
	remote.Send(ctx, ch, out)
}

// DecodeFrame decodes a streamed frame without reflection
// (remote.FrameDecoder): choices' token_ids, text and finish_reason,
// usage, kv_transfer_params and error; other members are skipped. A
// member named twice is declined (encoding/json merges such).
func (r *response) DecodeFrame(data []byte) bool {
	s := remote.NewScan(data)
	return s.Object(frameKeys, func(i int) (ok bool) {
		switch i {
		case 0:
			return s.Null() || r.decodeChoices(s)
		case 1:
			if s.Null() {
				return true
			}
			r.Usage, ok = s.Usage()
			return ok
		case 2:
			r.KVTransferParams, ok = s.RawCopy()
		default:
			r.Error, ok = s.RawCopy()
		}
		return ok
	}) && s.End()
}

// frameKeys and choiceKeys are the members DecodeFrame takes, in the
// order its member functions number them.
var (
	frameKeys  = []string{"choices", "usage", "kv_transfer_params", "error"}
	choiceKeys = []string{"token_ids", "text", "finish_reason"}
)

func (r *response) decodeChoices(s *remote.Scan) bool {
	r.Choices = make([]choice, 0, 1)
	return s.Array(func() bool {
		r.Choices = append(r.Choices, choice{})
		return r.Choices[len(r.Choices)-1].decode(s)
	})
}

func (c *choice) decode(s *remote.Scan) bool {
	return s.Object(choiceKeys, func(i int) (ok bool) {
		switch {
		case i == 0:
			c.TokenIDs, ok = s.Uint32s(nil)
			return ok
		case s.Null():
			// encoding/json leaves a string as it was on null, a pointer nil.
			return true
		case i == 1:
			c.Text, ok = s.String()
			return ok
		default:
			var f string
			if f, ok = s.String(); ok {
				c.FinishReason = &f
			}
			return ok
		}
	})
}
