package sglang

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/remote"
	"github.com/kvmesh/kvmesh/hints"
	"github.com/kvmesh/kvmesh/internal/stages"
	"github.com/kvmesh/kvmesh/kv"
)

// generateRequest is the body of POST /generate (SGLang's
// GenerateReqInput). Fields left at their zero value are omitted, so
// SGLang applies its own defaults.
type generateRequest struct {
	RID            string          `json:"rid,omitempty"`
	InputIDs       []kv.Token      `json:"-"` // written first by remote.JSONWithTokens
	SamplingParams samplingParams  `json:"sampling_params"`
	Stream         bool            `json:"stream"`
	LoRAPath       string          `json:"lora_path,omitempty"`
	CacheSalt      string          `json:"cache_salt,omitempty"`
	RoutedDPRank   *int            `json:"routed_dp_rank,omitempty"`
	KVHints        json.RawMessage `json:"kv_hints,omitempty"`
	KVRouterHint   *RouterHint     `json:"kv_router_hint,omitempty"`
	Bootstrap
}

// samplingParams is SGLang's SamplingParams as a request dict.
type samplingParams struct {
	MaxNewTokens     int        `json:"max_new_tokens"`
	MinNewTokens     int        `json:"min_new_tokens,omitempty"`
	Temperature      float64    `json:"temperature"`
	TopP             float64    `json:"top_p,omitempty"`
	FrequencyPenalty float64    `json:"frequency_penalty,omitempty"`
	PresencePenalty  float64    `json:"presence_penalty,omitempty"`
	StopTokenIDs     []kv.Token `json:"stop_token_ids,omitempty"`
	IgnoreEOS        bool       `json:"ignore_eos,omitempty"`
	SamplingSeed     *int64     `json:"sampling_seed,omitempty"`
}

// RouterHint is GenerateReqInput.kv_router_hint: the peer holding the
// prefix and the prompt's leading block hashes in SGLang's own domain
// (signed 64-bit integers, as its KV events carry them).
type RouterHint struct {
	SourceControlEndpoint string  `json:"source_control_endpoint"`
	BlockHashes           []int64 `json:"block_hashes"`
}

// Bootstrap pairs a prefill and a decode request in SGLang's disaggregated
// serving: the prefill server's host and --disaggregation-bootstrap-port,
// and a room both requests name. They are a prefill leg's transfer
// parameters, and the decode leg's request fields.
type Bootstrap struct {
	Host string  `json:"bootstrap_host,omitempty"`
	Port int     `json:"bootstrap_port,omitempty"`
	Room *uint64 `json:"bootstrap_room,omitempty"`
}

// maxRoom is the largest bootstrap_room SGLang draws (2^63-1).
const maxRoom = math.MaxInt64

// NewRoom draws a random bootstrap room congruent to rank modulo dpSize:
// a DP prefill server places a request on rank room % dp_size.
func NewRoom(rank, dpSize int) uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	r := binary.LittleEndian.Uint64(b[:]) & maxRoom
	if dpSize <= 1 {
		return r
	}
	d := uint64(dpSize)
	r = r - r%d + uint64(rank)
	if r > maxRoom {
		r -= d
	}
	return r
}

// body builds the request for req's leg; for a prefill leg it also returns
// the bootstrap parameters the decode leg must carry.
func (e *Engine) body(req *engine.Request) (*generateRequest, []byte, error) {
	b := &generateRequest{RID: req.ID, InputIDs: req.Tokens, Stream: true, LoRAPath: req.LoRA, CacheSalt: req.CacheSalt,
		SamplingParams: samplingParams{MaxNewTokens: req.MaxTokens, MinNewTokens: req.MinTokens, Temperature: req.Temperature,
			TopP: req.TopP, FrequencyPenalty: req.FrequencyPenalty, PresencePenalty: req.PresencePenalty,
			StopTokenIDs: req.StopTokens, IgnoreEOS: req.IgnoreEOS}}
	seed := int64(req.Seed) // SGLang's sampling_seed is a Python int; kvmesh's seed, bit for bit
	b.SamplingParams.SamplingSeed = &seed
	if e.cfg.DPSize > 1 {
		rank := req.DPRank
		b.RoutedDPRank = &rank
	}
	if req.KVHint != nil && req.Leg != kv.LegDecode {
		switch e.cfg.HintForm {
		case remote.HintNative:
			enc, err := hints.Encode(hints.SGLang, hints.FromHint(req.KVHint))
			if err != nil {
				return nil, nil, err
			}
			b.KVHints = enc
		case remote.HintBridge:
			rh := &RouterHint{SourceControlEndpoint: req.KVHint.Endpoint, BlockHashes: make([]int64, len(req.KVHint.Hashes))}
			for i, h := range req.KVHint.Hashes {
				rh.BlockHashes[i] = int64(h) // SGLang's own signed value, as its events carried it
			}
			b.KVRouterHint = rh
		}
	}
	var params []byte
	switch req.Leg {
	case kv.LegWhole:
		if e.cfg.Role == kv.RoleDecode {
			// SGLang's decode server takes only requests paired with a
			// prefill; it cannot compute a prompt alone.
			return nil, nil, errors.New("an SGLang decode server cannot prefill a request alone: run the frontend with --disagg-local-prefill-tokens 0 (serve --engine sglang does)")
		}
	case kv.LegPrefill:
		room := NewRoom(req.DPRank, e.cfg.DPSize)
		b.Bootstrap = Bootstrap{Host: e.cfg.BootstrapHost, Port: e.bootstrapPort, Room: &room}
		params, _ = json.Marshal(b.Bootstrap)
	case kv.LegDecode:
		bs, err := ParseBootstrap(req.TransferParams)
		if err != nil {
			return nil, nil, err
		}
		b.Bootstrap = bs
	default:
		return nil, nil, fmt.Errorf("unknown leg %v", req.Leg)
	}
	return b, params, nil
}

// ParseBootstrap reads a decode leg's transfer parameters: the prefill
// leg's bootstrap_host, bootstrap_port and bootstrap_room.
func ParseBootstrap(raw []byte) (Bootstrap, error) {
	var bs Bootstrap
	p := bytes.TrimSpace(raw)
	if len(p) == 0 || p[0] != '{' {
		return bs, errors.New("an SGLang decode leg needs bootstrap_host, bootstrap_port and bootstrap_room (a JSON object)")
	}
	if err := json.Unmarshal(p, &bs); err != nil {
		return bs, fmt.Errorf("SGLang decode leg: bad bootstrap parameters: %v", err)
	}
	switch {
	case bs.Host == "":
		return bs, errors.New("SGLang decode leg: bootstrap_host missing")
	case bs.Port <= 0 || bs.Port > 65535:
		return bs, fmt.Errorf("SGLang decode leg: bootstrap_port %d", bs.Port)
	case bs.Room == nil || *bs.Room > maxRoom:
		return bs, errors.New("SGLang decode leg: bootstrap_room missing or beyond 2^63-1")
	}
	return bs, nil
}

// Generate posts the request to /generate and streams its tokens. A 4xx
// (or an abort the engine gives a 4xx status) is returned as the request's
// error (*remote.RejectedError); a refused connection, a 5xx or a stream
// cut short wraps engine.ErrUnavailable, so the request migrates.
//
// A prefill leg's first chunk carries the bootstrap parameters as soon as
// the prefill server has the request: SGLang's decode side must receive
// the same request at the same time, and the prefill answers only once
// the decode has taken its KV. Its last chunk ends the leg.
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
	b, params, err := e.body(req)
	if err != nil {
		return nil, err
	}
	payload, err := remote.JSONWithTokens("input_ids", b.InputIDs, b)
	if err != nil {
		return nil, err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, e.cfg.URL+"/generate", bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Content-Type", "application/json")
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
		if params != nil && !remote.Send(ctx, ch, engine.Chunk{TransferParams: params}) {
			return
		}
		e.readStream(ctx, resp.Body, len(req.Tokens), req.Leg, ch)
	}()
	return ch, nil
}

// response is one streamed /generate frame (or a whole answer).
type response struct {
	Text      string          `json:"text"`
	OutputIDs []kv.Token      `json:"output_ids"`
	MetaInfo  metaInfo        `json:"meta_info"`
	Error     json.RawMessage `json:"error"`

	// skip, set before DecodeFrame, lets it leave out output_ids' first
	// skip ids, the ones a cumulative stream resends in every frame
	// (without it a stream of n tokens decodes n²/2 ids); skipped is how
	// many it left out. It keeps them out only of a frame that is
	// cumulative by its own count (completion_tokens, when given, equal
	// to the ids' number) and declines any other.
	skip, skipped int
}

type metaInfo struct {
	ID               string          `json:"id"`
	FinishReason     json.RawMessage `json:"finish_reason"`
	PromptTokens     int             `json:"prompt_tokens"`
	CompletionTokens *int            `json:"completion_tokens"`
	CachedTokens     int             `json:"cached_tokens"`
}

// finishReason is meta_info.finish_reason: {type: stop|length|abort, …}.
type finishReason struct {
	Type       string `json:"type"`
	Message    string `json:"message"`
	StatusCode int    `json:"status_code"`
	ErrType    string `json:"err_type"`
}

// finish maps a finish_reason; a non-nil error ends the stream (an abort:
// the request's fault when SGLang gives it a 4xx status, else the
// engine's, so another worker may finish it).
func finish(raw json.RawMessage) (kv.FinishReason, error) {
	var f finishReason
	if err := json.Unmarshal(raw, &f); err != nil {
		var s string // a bare string, as some builds and the OpenAI layer write it
		if json.Unmarshal(raw, &s) != nil {
			return kv.FinishNone, remote.Lost(fmt.Errorf("bad finish_reason %s", raw))
		}
		f.Type = s
	}
	switch f.Type {
	case "length":
		return kv.FinishLength, nil
	case "stop":
		return kv.FinishStop, nil
	case "abort":
		msg := f.Message
		if msg == "" {
			msg = "the engine aborted the request"
		}
		if f.StatusCode >= 400 && f.StatusCode < 500 && f.StatusCode != http.StatusRequestTimeout && f.StatusCode != http.StatusTooManyRequests {
			return kv.FinishError, &remote.RejectedError{Status: f.StatusCode, Message: msg}
		}
		return kv.FinishError, remote.Lost(fmt.Errorf("engine aborted the request: %s", msg))
	}
	return kv.FinishStop, nil
}

// streamError reads {"error":{"message":…}} sent inside a stream: SGLang
// sends it for a request its validation refused (a ValueError), so it is
// the request's fault unless it names a 5xx code.
func streamError(raw json.RawMessage) error {
	var inner struct {
		Message string `json:"message"`
		Code    any    `json:"code"`
	}
	_ = json.Unmarshal(raw, &inner)
	msg := inner.Message
	if msg == "" {
		msg = remote.ErrorMessage(raw)
	}
	if msg == "" {
		msg = string(raw)
	}
	if c, ok := inner.Code.(float64); ok && c >= 500 {
		return remote.Lost(fmt.Errorf("engine error: %s", msg))
	}
	return &remote.RejectedError{Status: http.StatusBadRequest, Message: msg}
}

func (e *Engine) readStream(ctx context.Context, body io.Reader, promptLen int, leg kv.Leg, ch chan<- engine.Chunk) {
	var (
		fin     kv.FinishReason
		pending []kv.Token // the finishing frame's new tokens, sent with the usage
		u       *engine.Usage
		n       int // output tokens passed on so far
	)
	var preset func(*response)
	if !e.incremental() {
		preset = func(r *response) { r.skip = n }
	}
	err := remote.ReadFramesPreset(ctx, body, "", func() bool { return fin != kv.FinishNone }, preset, func(r *response) error {
		if len(r.Error) > 0 && string(r.Error) != "null" {
			return streamError(r.Error)
		}
		if fin != kv.FinishNone {
			return nil // nothing follows a finish but [DONE]
		}
		fresh := r.OutputIDs // the ids after the n passed on, when skipped
		if r.skipped == 0 {
			var err error
			if fresh, err = e.newTokens(r.OutputIDs, r.MetaInfo.CompletionTokens, n); err != nil {
				return remote.Lost(err)
			}
		}
		n += len(fresh)
		if fr := r.MetaInfo.FinishReason; len(fr) > 0 && string(fr) != "null" {
			f, err := finish(fr)
			if err != nil {
				return err
			}
			m := r.MetaInfo
			u = &engine.Usage{PromptTokens: m.PromptTokens, CompletionTokens: n, CachedTokens: m.CachedTokens}
			if u.PromptTokens == 0 {
				u.PromptTokens = promptLen
			}
			fin, pending = f, fresh
			return nil
		}
		if leg != kv.LegPrefill && len(fresh) > 0 && !remote.Send(ctx, ch, engine.Chunk{Tokens: fresh}) {
			return remote.ErrStopped
		}
		return nil
	})
	if !remote.StreamEnded(ctx, ch, err, fin) {
		return
	}
	if leg == kv.LegPrefill {
		// The decode leg's stream is the client's; the prefill's own token
		// only says the leg is over.
		pending = nil
	}
	remote.Send(ctx, ch, engine.Chunk{Tokens: pending, Finish: fin, Usage: u})
}

// newTokens returns the tokens of a frame not passed on yet. SGLang streams
// output_ids cumulatively unless the server runs with incremental
// streaming; meta_info.completion_tokens (cumulative in both modes) tells
// which this frame is, and the server's setting decides when it is absent.
func (e *Engine) newTokens(ids []kv.Token, completion *int, sent int) ([]kv.Token, error) {
	cumulative := !e.incremental()
	if completion != nil {
		switch c := *completion; {
		case len(ids) == c && c >= sent:
			cumulative = true
		case len(ids) == c-sent:
			cumulative = false
		}
	}
	if !cumulative {
		return ids, nil
	}
	if len(ids) < sent {
		return nil, fmt.Errorf("cumulative output_ids shrank from %d to %d tokens", sent, len(ids))
	}
	return ids[sent:], nil
}

// DecodeFrame decodes a streamed /generate frame without reflection
// (remote.FrameDecoder): text, output_ids, meta_info's id,
// finish_reason, prompt_tokens, completion_tokens and cached_tokens, and
// error; other members are skipped. A member named twice is declined.
func (r *response) DecodeFrame(data []byte) bool {
	s := remote.NewScan(data)
	if !s.Object(frameKeys, func(i int) (ok bool) {
		switch {
		case i == 1:
			r.OutputIDs, r.skipped, ok = s.Uint32sFrom(nil, r.skip)
		case i == 3:
			r.Error, ok = s.RawCopy()
		case s.Null():
			// encoding/json leaves a string or a struct as it was on null.
			return true
		case i == 0:
			r.Text, ok = s.String()
		default:
			ok = r.MetaInfo.decode(s)
		}
		return ok
	}) {
		return false
	}
	if r.skip > 0 {
		// Left out only what a cumulative frame resends.
		c := r.MetaInfo.CompletionTokens
		if r.skipped < r.skip || (c != nil && *c != r.skipped+len(r.OutputIDs)) {
			return false
		}
	}
	return s.End()
}

// frameKeys and metaKeys are the members DecodeFrame takes, in the order
// its member functions number them.
var (
	frameKeys = []string{"text", "output_ids", "meta_info", "error"}
	metaKeys  = []string{"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens"}
)

func (m *metaInfo) decode(s *remote.Scan) bool {
	return s.Object(metaKeys, func(i int) (ok bool) {
		switch {
		case i == 1:
			m.FinishReason, ok = s.RawCopy()
		case i == 3 && s.Null():
			m.CompletionTokens = nil
			return true
		case s.Null():
			// encoding/json leaves a string or an int as it was on null.
			return true
		case i == 0:
			m.ID, ok = s.String()
		case i == 2:
			m.PromptTokens, ok = s.Int()
		case i == 3:
			var n int
			if n, ok = s.Int(); ok {
				m.CompletionTokens = &n
			}
		default:
			m.CachedTokens, ok = s.Int()
		}
		return ok
	})
}
