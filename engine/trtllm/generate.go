package trtllm

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/remote"
	"github.com/kvmesh/kvmesh/internal/stages"
	"github.com/kvmesh/kvmesh/kv"
)

// completionRequest is the body of POST /v1/completions, only fields
// TensorRT-LLM's CompletionRequest defines (it refuses any other).
type completionRequest struct {
	Model               string                `json:"model"`
	Prompt              []kv.Token            `json:"-"` // written first by remote.JSONWithTokens
	MaxTokens           int                   `json:"max_tokens"`
	Stream              bool                  `json:"stream"`
	StreamOptions       *remote.StreamOptions `json:"stream_options,omitempty"`
	Temperature         float64               `json:"temperature"`
	TopP                float64               `json:"top_p,omitempty"`
	Seed                *uint64               `json:"seed,omitempty"`
	PresencePenalty     float64               `json:"presence_penalty,omitempty"`
	FrequencyPenalty    float64               `json:"frequency_penalty,omitempty"`
	StopTokenIDs        []kv.Token            `json:"stop_token_ids,omitempty"`
	MinTokens           int                   `json:"min_tokens,omitempty"`
	IgnoreEOS           bool                  `json:"ignore_eos,omitempty"`
	Detokenize          bool                  `json:"detokenize"`
	DisaggregatedParams json.RawMessage       `json:"disaggregated_params,omitempty"`
}

type choice struct {
	TokenIDs            []kv.Token      `json:"token_ids"`
	Text                string          `json:"text"`
	FinishReason        *string         `json:"finish_reason"`
	DisaggregatedParams json.RawMessage `json:"disaggregated_params"`
}

// response is a streamed chunk, a whole response, or an error object
// (TensorRT-LLM's ErrorResponse is flat: object "error", message, code).
type response struct {
	Object         string          `json:"object"`
	Message        string          `json:"message"`
	Code           any             `json:"code"`
	Error          json.RawMessage `json:"error"`
	Choices        []choice        `json:"choices"`
	Usage          *remote.Usage   `json:"usage"`
	PromptTokenIDs json.RawMessage `json:"prompt_token_ids"`
}

// Handoff is what a context leg's answer hands the generation leg, as
// engine.Chunk.TransferParams: the context choice's disaggregated_params
// exactly as the engine wrote them, and the answer's prompt_token_ids.
type Handoff struct {
	DisaggregatedParams json.RawMessage `json:"disaggregated_params"`
	PromptTokenIDs      json.RawMessage `json:"prompt_token_ids,omitempty"`
}

// Request types of DisaggregatedParams.
const (
	contextOnly    = "context_only"
	generationOnly = "generation_only"
)

// disaggRequestID draws the id a context leg names itself by: positive,
// below 2^63 (TensorRT-LLM reads it as a signed integer).
func disaggRequestID() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])>>1 | 1
}

// generationParams turns a context answer's parameters into the
// generation leg's: request_type becomes generation_only, every other
// field passes unchanged.
func generationParams(raw json.RawMessage) (json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return nil, errors.New("disaggregated_params of a generation leg must be a JSON object")
	}
	m["request_type"] = json.RawMessage(`"` + generationOnly + `"`)
	return json.Marshal(m)
}

// body builds the request for req's leg.
func (e *Engine) body(req *engine.Request) (*completionRequest, error) {
	switch {
	case req.LoRA != "":
		return nil, &remote.RejectedError{Status: http.StatusBadRequest,
			Message: fmt.Sprintf("lora %q: TensorRT-LLM takes an adapter as a lora_request with its path, which kvmesh's TensorRT-LLM adapter does not send", req.LoRA)}
	case req.CacheSalt != "":
		return nil, &remote.RejectedError{Status: http.StatusBadRequest,
			Message: "cache_salt: TensorRT-LLM's requests have no cache salt"}
	}
	seed := req.Seed
	b := &completionRequest{Model: e.cfg.Model, Prompt: req.Tokens, MaxTokens: req.MaxTokens, Stream: true,
		StreamOptions: &remote.StreamOptions{IncludeUsage: true}, Temperature: req.Temperature, TopP: req.TopP, Seed: &seed,
		PresencePenalty: req.PresencePenalty, FrequencyPenalty: req.FrequencyPenalty, StopTokenIDs: req.StopTokens,
		MinTokens: req.MinTokens, IgnoreEOS: req.IgnoreEOS}
	switch req.Leg {
	case kv.LegWhole:
	case kv.LegPrefill:
		// The context phase answers whole, with its first token(s) and the
		// parameters the generation phase continues from.
		b.Stream, b.StreamOptions = false, nil
		b.DisaggregatedParams = json.RawMessage(`{"request_type":"` + contextOnly + `","disagg_request_id":` +
			strconv.FormatUint(disaggRequestID(), 10) + `}`)
	case kv.LegDecode:
		if len(req.TransferParams) == 0 {
			return nil, errors.New("a generation leg needs the context answer's disaggregated_params")
		}
		var h Handoff
		if err := json.Unmarshal(req.TransferParams, &h); err != nil || isNull(h.DisaggregatedParams) {
			return nil, errors.New("kv_transfer_params of a TensorRT-LLM generation leg must be {\"disaggregated_params\":{…},\"prompt_token_ids\":[…]} as its context leg answered")
		}
		p, err := generationParams(h.DisaggregatedParams)
		if err != nil {
			return nil, err
		}
		b.DisaggregatedParams = p
		if !isNull(h.PromptTokenIDs) {
			var ids []kv.Token
			if err := json.Unmarshal(h.PromptTokenIDs, &ids); err != nil || len(ids) == 0 {
				return nil, errors.New("prompt_token_ids of a TensorRT-LLM handoff must be a non-empty list of token ids")
			}
			b.Prompt = ids
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
	if req.DPRank != 0 {
		return nil, fmt.Errorf("dp rank %d but a TensorRT-LLM server is one rank to kvmesh", req.DPRank)
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
		defer e.finished.Add(1)
		if b.Stream {
			e.readStream(ctx, resp.Body, len(req.Tokens), ch)
		} else {
			e.readWhole(ctx, resp.Body, req, ch)
		}
	}()
	return ch, nil
}

// finish maps TensorRT-LLM's finish_reason; ok is false for cancelled and
// timeout (the engine dropped the request: another worker may finish it).
func finish(s string) (kv.FinishReason, bool) {
	switch s {
	case "stop":
		return kv.FinishStop, true
	case "length":
		return kv.FinishLength, true
	}
	return kv.FinishError, false
}

// errorOf reads an error object sent in place of a chunk, flat or nested,
// classified by remote.CodedError; nil when r is none.
func errorOf(r *response) error {
	switch {
	case r.Object == "error":
		return remote.CodedError(r.Message, r.Code)
	case !isNull(r.Error):
		return remote.StreamError(r.Error)
	}
	return nil
}

func (e *Engine) readStream(ctx context.Context, body io.Reader, promptLen int, ch chan<- engine.Chunk) {
	var (
		fin     kv.FinishReason
		pending []kv.Token // the finishing chunk's tokens, sent with the usage
		u       *engine.Usage
		n       int
	)
	err := remote.ReadFrames(ctx, body, func() bool { return fin != kv.FinishNone }, func(r *response) error {
		if err := errorOf(r); err != nil {
			return err
		}
		if r.Usage != nil {
			u = r.Usage.Engine()
		}
		if len(r.Choices) == 0 {
			return nil
		}
		c := r.Choices[0]
		if c.TokenIDs == nil && c.Text != "" {
			return errors.New("TensorRT-LLM returned text without token_ids: it needs detokenize=false support")
		}
		n += len(c.TokenIDs)
		if c.FinishReason != nil && *c.FinishReason != "not_finished" {
			f, ok := finish(*c.FinishReason)
			if !ok {
				return remote.Lost(fmt.Errorf("engine ended the request early (finish_reason %q)", *c.FinishReason))
			}
			fin, pending = f, append(pending, c.TokenIDs...)
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

// readWhole reads a non-streamed answer (a context leg). A context answer
// that finished for a reason other than length (or not at all:
// not_finished, null) is final; otherwise its parameters and prompt
// become the generation leg's handoff.
func (e *Engine) readWhole(ctx context.Context, body io.Reader, req *engine.Request, ch chan<- engine.Chunk) {
	var r response
	if err := json.NewDecoder(body).Decode(&r); err != nil {
		if ctx.Err() == nil {
			remote.Send(ctx, ch, engine.Chunk{Err: remote.Lost(fmt.Errorf("bad response: %v", err)), Finish: kv.FinishError})
		}
		return
	}
	if err := errorOf(&r); err != nil {
		remote.Send(ctx, ch, engine.Chunk{Err: err, Finish: kv.FinishError})
		return
	}
	if len(r.Choices) == 0 {
		remote.Send(ctx, ch, engine.Chunk{Err: remote.Lost(errNoChoice), Finish: kv.FinishError})
		return
	}
	c := r.Choices[0]
	reason := "not_finished"
	if c.FinishReason != nil {
		reason = *c.FinishReason
	}
	out := engine.Chunk{Tokens: c.TokenIDs}
	if r.Usage != nil {
		out.Usage = r.Usage.Engine()
	} else {
		out.Usage = &engine.Usage{PromptTokens: len(req.Tokens), CompletionTokens: len(c.TokenIDs)}
	}
	continues := (reason == "length" || reason == "not_finished") && !isNull(c.DisaggregatedParams)
	switch {
	case continues:
		h, err := json.Marshal(Handoff{DisaggregatedParams: c.DisaggregatedParams, PromptTokenIDs: r.PromptTokenIDs})
		if err != nil {
			remote.Send(ctx, ch, engine.Chunk{Err: remote.Lost(err), Finish: kv.FinishError})
			return
		}
		out.Finish, out.TransferParams = kv.FinishLength, h
	case reason == "not_finished":
		remote.Send(ctx, ch, engine.Chunk{Err: remote.Lost(errors.New("context answer neither finished nor carried disaggregated_params")), Finish: kv.FinishError})
		return
	default:
		f, ok := finish(reason)
		if !ok {
			remote.Send(ctx, ch, engine.Chunk{Err: remote.Lost(fmt.Errorf("engine ended the request early (finish_reason %q)", reason)), Finish: kv.FinishError})
			return
		}
		out.Finish = f
	}
	remote.Send(ctx, ch, out)
}

// DecodeFrame decodes a streamed frame without reflection
// (remote.FrameDecoder): object, message, error, choices' token_ids,
// text, finish_reason and disaggregated_params, usage and
// prompt_token_ids; other members are skipped. A code other than null
// (error objects only) and a member named twice are declined.
func (r *response) DecodeFrame(data []byte) bool {
	s := remote.NewScan(data)
	return s.Object(frameKeys, func(i int) (ok bool) {
		switch {
		case i == 3:
			r.Error, ok = s.RawCopy()
		case i == 6:
			r.PromptTokenIDs, ok = s.RawCopy()
		case s.Null():
			// encoding/json leaves a string as it was on null, the rest nil.
			return true
		case i == 0:
			r.Object, ok = s.String()
		case i == 1:
			r.Message, ok = s.String()
		case i == 2:
			return false
		case i == 4:
			ok = r.decodeChoices(s)
		default:
			r.Usage, ok = s.Usage()
		}
		return ok
	}) && s.End()
}

// frameKeys and choiceKeys are the members DecodeFrame takes, in the
// order its member functions number them.
var (
	frameKeys  = []string{"object", "message", "code", "error", "choices", "usage", "prompt_token_ids"}
	choiceKeys = []string{"token_ids", "text", "finish_reason", "disaggregated_params"}
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
		case i == 3:
			c.DisaggregatedParams, ok = s.RawCopy()
		case s.Null():
			// encoding/json leaves a string as it was on null, a pointer nil.
			return true
		case i == 1:
			c.Text, ok = s.String()
		default:
			var f string
			if f, ok = s.String(); ok {
				c.FinishReason = &f
			}
		}
		return ok
	})
}
