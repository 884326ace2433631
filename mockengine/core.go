package mockengine

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/tokenizer"
	"github.com/kvmesh/kvmesh/transfer"
)

// core is what every stand-in runs the same way: the simulated engine and
// its set-up, the tokenizer, chat template and stop tokens, the context
// bound, the closed flag, and both ends of a block handoff (leases and
// side channels on the producer, pulls and notifications on the
// consumer). Each engine's wire (routes, request fields, response shapes,
// metric names) sits on top of it.
type core struct {
	log     *slog.Logger
	eng     *sim.Engine
	sc      sim.Config // the engine's, defaults filled in
	tok     tokenizer.Tokenizer
	tmpl    tokenizer.ChatTemplate
	eos     []kv.Token
	maxLen  int // prompt + output tokens (vLLM's max_model_len, TensorRT-LLM's max_seq_len)
	created int64
	closed  atomic.Bool

	// Block handoffs; empty unless startHandoffs ran.
	leases []*Leases // per rank
	sides  []*SideChannel
	host   string // where the side channels listen, as handoffs name it
	client *transfer.Client
	engID  string
	pulls  sync.Map // engine request id → *pullState
	pull   pullCounters
}

type pullCounters struct {
	ok, failed, notHeld, blocks, notified, notifyFailed, localHits atomic.Uint64
}

// coreConfig is what start needs of a stand-in's configuration.
type coreConfig struct {
	sim       sim.Config
	maxLen    int    // 0: the smaller of one rank's KV capacity and 32768
	maxLenArg string // the option maxLen comes from, for the error that refuses it
	tok       tokenizer.Tokenizer
	tmpl      tokenizer.ChatTemplate
	log       *slog.Logger
	// pulls: the sim asks the core for a request's missing prompt blocks
	// (a consumer of handoffs).
	pulls bool
}

// start loads the tokenizer (the built-in o200k and ChatML where cfg has
// none) and starts the engine with real block bytes and checksums, as a
// handoff needs them.
func (c *core) start(cfg coreConfig) error {
	c.log, c.tok, c.tmpl, c.created = cfg.log, cfg.tok, cfg.tmpl, time.Now().Unix()
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.tok == nil || c.tmpl == nil {
		tok, tmpl, err := tokenizer.Builtin()
		if err != nil {
			return err
		}
		if c.tok == nil {
			c.tok = tok
		}
		if c.tmpl == nil {
			c.tmpl = tmpl
		}
	}
	for _, s := range []string{"<|endoftext|>", "<|im_end|>"} {
		if id, ok := c.tok.TokenID(s); ok {
			c.eos = append(c.eos, id)
		}
	}
	sc := cfg.sim
	if sc.VocabSize == 0 {
		sc.VocabSize = c.tok.VocabSize()
	}
	sc.StoreChecksums = true
	if sc.Layers == 0 {
		sc.Layers = sim.DefaultLayers
	}
	if sc.PayloadSize == 0 {
		sc.PayloadSize = sim.DefaultPayloadSize
	}
	if cfg.pulls {
		sc.Fetcher = c.fetch
	}
	eng, err := sim.New(sc)
	if err != nil {
		return err
	}
	c.eng, c.sc = eng, eng.SimConfig()
	capTokens := c.sc.Blocks * c.sc.BlockSize
	c.maxLen = cfg.maxLen
	if c.maxLen <= 0 {
		c.maxLen = min(capTokens, 32768)
	}
	if c.maxLen > capTokens {
		eng.Close()
		return fmt.Errorf("%s %d exceeds one rank's KV capacity of %d tokens (%d blocks of %d)",
			cfg.maxLenArg, c.maxLen, capTokens, c.sc.Blocks, c.sc.BlockSize)
	}
	return nil
}

// handoffConfig is where a producer serves its blocks and how long both
// ends wait.
type handoffConfig struct {
	engineID    string        // "" draws one
	host        string        // "" is 127.0.0.1
	port        int           // rank 0's; rank r listens on port + r; 0 picks free ports
	lease       time.Duration // how long granted blocks wait for their consumer; 0: DefaultLeaseDuration
	pullTimeout time.Duration // bound on one pull; 0: DefaultPullTimeout
}

// startHandoffs starts, per rank, a lease table and a side channel that
// serves its blocks, and the client this engine pulls with.
func (c *core) startHandoffs(h handoffConfig) error {
	c.host, c.engID = h.host, h.engineID
	if c.host == "" {
		c.host = "127.0.0.1"
	}
	if c.engID == "" {
		c.engID = randomHex(16)
	}
	if h.lease <= 0 {
		h.lease = DefaultLeaseDuration
	}
	if h.pullTimeout <= 0 {
		h.pullTimeout = DefaultPullTimeout
	}
	c.client = transfer.NewClient(transfer.ClientOptions{Timeout: h.pullTimeout})
	for r := range c.eng.DPSize() {
		l := NewLeases(c.eng.Rank(r), c.sc.Layers, c.sc.PayloadSize, h.lease)
		c.leases = append(c.leases, l)
		port := 0
		if h.port > 0 {
			port = h.port + r
		}
		s, err := ServeSideChannel(net.JoinHostPort(c.host, strconv.Itoa(port)), l, sideDigest(c.engID, c.sc.Digest), c.log)
		if err != nil {
			return fmt.Errorf("side channel of rank %d: %w", r, err)
		}
		c.sides = append(c.sides, s)
	}
	return nil
}

// stop closes the side channels, leases, engine and pull client, once:
// first is false when it had run already.
func (c *core) stop() (first bool, err error) {
	if c.closed.Swap(true) {
		return false, nil
	}
	var errs []error
	for _, s := range c.sides {
		errs = append(errs, s.Close())
	}
	for _, l := range c.leases {
		l.Close()
	}
	errs = append(errs, c.eng.Close())
	if c.client != nil {
		errs = append(errs, c.client.Close())
	}
	return true, errors.Join(errs...)
}

// generate hands req to the engine; a refusal comes with the HTTP status
// it answers with (503 once closed, else 400).
func (c *core) generate(ctx context.Context, req *engine.Request) (<-chan engine.Chunk, int, error) {
	ch, err := c.eng.Generate(ctx, req)
	switch {
	case err == nil:
		return ch, 0, nil
	case errors.Is(err, engine.ErrClosed):
		return nil, http.StatusServiceUnavailable, err
	}
	return nil, http.StatusBadRequest, err
}

// leaseStats is rank r's lease table (zero without handoffs).
func (c *core) leaseStats(r int) LeaseStats {
	if r < 0 || r >= len(c.leases) {
		return LeaseStats{}
	}
	return c.leases[r].Stats()
}

// sidePort is rank r's side-channel port (0 without handoffs).
func (c *core) sidePort(r int) int {
	if r < 0 || r >= len(c.sides) {
		return 0
	}
	return c.sides[r].Port()
}

// PullStats counts the consumer side's pulls.
type PullStats struct {
	OK, Failed     uint64 // pulls that delivered what the producer held / that failed
	NotHeld        uint64 // pulls the producer answered with no block: the lease ended, or its blocks are of another cache_salt (also in Failed)
	Blocks         uint64 // blocks pulled and inserted
	LocalHits      uint64 // consumers whose prompt was all cached here: notify only
	Notified       uint64 // notifications the producer acknowledged
	NotifyFailures uint64
}

// PullStats returns the consumer-side counters.
func (c *core) PullStats() PullStats {
	p := &c.pull
	return PullStats{OK: p.ok.Load(), Failed: p.failed.Load(), NotHeld: p.notHeld.Load(), Blocks: p.blocks.Load(),
		LocalHits: p.localHits.Load(), Notified: p.notified.Load(), NotifyFailures: p.notifyFailed.Load()}
}

// seedFor is a request's sampling seed. The sim samples deterministically
// from its context and seed: a seed (or temperature 0) gives repeatable
// output, else each request draws one, as a sampling engine's output
// varies.
func seedFor[T int64 | uint64](seed *T, temperature float64) uint64 {
	switch {
	case seed != nil:
		return uint64(*seed)
	case temperature > 0:
		return rand64()
	}
	return 0
}

// stopTokens are a request's stop tokens: the EOS tokens unless ignored
// (stop_token_ids still stop) and ids, which are also returned as a set
// (a stop by one is reported as stop_reason).
func (c *core) stopTokens(ignoreEOS bool, ids []int64) ([]kv.Token, map[kv.Token]bool, error) {
	var out []kv.Token
	if !ignoreEOS {
		out = append(out, c.eos...)
	}
	var set map[kv.Token]bool
	for _, t := range ids {
		if t < 0 || t > math.MaxUint32 {
			return nil, nil, fmt.Errorf("stop_token_ids: %d is not a token id", t)
		}
		if set == nil {
			set = make(map[kv.Token]bool)
		}
		set[kv.Token(t)] = true
		out = append(out, kv.Token(t))
	}
	return out, set, nil
}

// tokenIDs bounds prompt token ids by the vocabulary: the tokenizer's ids
// (chat markers and other special tokens included) are the model's; the
// sim only bounds what it generates. bad is the first id outside it.
func (c *core) tokenIDs(ids []int64) (out []kv.Token, bad int64, ok bool) {
	vocab := int64(max(c.sc.VocabSize, c.tok.VocabSize()))
	out = make([]kv.Token, len(ids))
	for i, id := range ids {
		if id < 0 || id >= vocab {
			return nil, id, false
		}
		out[i] = kv.Token(id)
	}
	return out, 0, true
}

// renderChat applies the chat template (generation prompt added) and
// tokenizes the result with its special tokens.
func (c *core) renderChat(msgs []chatMessage) ([]kv.Token, error) {
	if len(msgs) == 0 {
		return nil, errors.New("messages must be a non-empty list")
	}
	tm := make([]tokenizer.Message, len(msgs))
	for i, m := range msgs {
		text, err := messageText(m.Content)
		if err != nil {
			return nil, fmt.Errorf("messages[%d].content: %v", i, err)
		}
		tm[i] = tokenizer.Message{Role: m.Role, Content: text, Name: m.Name}
	}
	s, err := c.tmpl.Render(tm, true)
	if err != nil {
		return nil, err
	}
	return c.tok.EncodeWithSpecial(s), nil
}

func randomHex(n int) string {
	b := make([]byte, (n+1)/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)[:n]
}

func rand64() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}
