package sim

import (
	"context"
	"fmt"

	"github.com/kvmesh/kvmesh/clock"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/kv"
)

// Defaults follow Dynamo's mocker (MockEngineArgs).
const (
	DefaultBlockSize        = 64
	DefaultBlocks           = 16384
	DefaultMaxBatchedTokens = 8192
	DefaultMaxSeqs          = 256
	DefaultWatermark        = 0.01
	DefaultLayers           = 2
	DefaultPayloadSize      = 64
	DefaultVocabSize        = 200000
	DefaultBandwidth        = 64e9 // bytes/s, the mocker's KV transfer bandwidth
)

// Config describes a simulated engine. Start from DefaultConfig and change
// what you need; NewCore fills zero sizes with defaults.
type Config struct {
	engine.Config

	// Worker is the key every KV event carries (with DPSize > 1, rank r's
	// events carry DPRank r).
	Worker kv.WorkerKey
	// DPSize is the number of data-parallel ranks the Engine runs (0: 1).
	// Each rank is a whole engine of its own: a Core with Blocks blocks, its
	// own batch, stepping loop and event stream; Request.DPRank picks one.
	// A Core is always one rank and ignores it.
	DPSize int
	// Watermark is the fraction of blocks kept free when admitting a waiting
	// request (running requests may use them).
	Watermark float64
	// Layers and PayloadSize shape each block's payload: Layers slices of
	// PayloadSize bytes, derived with kv.FillPayload(seq hash, layer).
	Layers      int
	PayloadSize int
	// VocabSize bounds generated token ids to [0, VocabSize).
	VocabSize int
	// OutputTokens, when set, are the ids generated tokens are drawn from
	// (a readable vocabulary, e.g. tokenizer.PlainWordTokens) instead of
	// [0, VocabSize); each must be below VocabSize.
	OutputTokens []kv.Token
	// SpeedupRatio divides the modelled time the Engine wrapper waits per
	// pass; 0 means it does not wait at all. DecodeSpeedupRatio further
	// divides the decode part (≤ 0 means 1). Core.Step always reports the
	// modelled (undivided-by-SpeedupRatio) duration.
	SpeedupRatio       float64
	DecodeSpeedupRatio float64
	// Timing predicts pass durations; nil means Polynomial.
	Timing TimingModel
	// TransferBandwidth (bytes/s) prices fetched blocks; ≤ 0 makes them free.
	// TransferBytesPerBlock is the modelled size of one block for that price
	// (a real model's KV block is far larger than the sim's payload); 0 uses
	// the real payload size, Layers·PayloadSize.
	TransferBandwidth     float64
	TransferBytesPerBlock int64
	// Fetcher, when set, is called once per request before it is queued for
	// prefill, with the full prompt blocks the local cache lacks. Whatever
	// it inserts is reused instead of recomputed.
	Fetcher Fetcher
	// Disagg configures prefill and decode legs (disagg.go).
	Disagg DisaggConfig
	// StoreChecksums keeps kv.Checksum of each block's payload (all layers),
	// of a computed block's derived bytes or an inserted block's bytes, for
	// BlockChecksum: a worker serving peers sends it instead of hashing
	// again, and bytes that changed since fail the peer's check. It costs
	// one hash per stored block (a computed block's when its bytes are
	// first read), so engines that never serve (the twin) leave it off.
	StoreChecksums bool
	// OmitEventTokens leaves kv.Event.Tokens empty (saves copying when the
	// consumer only needs hashes, as in the twin).
	OmitEventTokens bool
	// KVBM, when set, puts a KV block manager (host and disk tiers) behind
	// the device pool, driven through its connector (kvbm.go).
	KVBM *KVBMConfig
	// FullAdmitMatch makes admission match a waiting request's prefix every
	// time, where it would otherwise refuse without one when the answer is
	// known (a remembered refusal, the one-lookup bound): a check that
	// those shortcuts change nothing.
	FullAdmitMatch bool
	// Clock drives the Engine wrapper (nil means wall time). Core ignores it:
	// its driver passes the time in.
	Clock clock.Clock
}

// DefaultConfig returns the mocker defaults for an aggregated worker.
func DefaultConfig() Config {
	return Config{
		Config: engine.Config{
			Model:            "kvmesh-sim",
			Role:             kv.RoleAggregated,
			BlockSize:        DefaultBlockSize,
			Blocks:           DefaultBlocks,
			MaxBatchedTokens: DefaultMaxBatchedTokens,
			MaxSeqs:          DefaultMaxSeqs,
		},
		Watermark:          DefaultWatermark,
		Layers:             DefaultLayers,
		PayloadSize:        DefaultPayloadSize,
		VocabSize:          DefaultVocabSize,
		SpeedupRatio:       1,
		DecodeSpeedupRatio: 1,
		TransferBandwidth:  DefaultBandwidth,
	}
}

// normalize fills zero sizes with defaults and checks the rest.
func (c Config) normalize() (Config, error) {
	if c.BlockSize == 0 {
		c.BlockSize = DefaultBlockSize
	}
	if c.Blocks == 0 {
		c.Blocks = DefaultBlocks
	}
	if c.MaxBatchedTokens == 0 {
		c.MaxBatchedTokens = DefaultMaxBatchedTokens
	}
	if c.MaxSeqs == 0 {
		c.MaxSeqs = DefaultMaxSeqs
	}
	if c.VocabSize == 0 {
		c.VocabSize = DefaultVocabSize
	}
	if c.Role == "" {
		c.Role = kv.RoleAggregated
	}
	if c.Model == "" {
		c.Model = "kvmesh-sim"
	}
	if c.DPSize == 0 {
		c.DPSize = 1
	}
	if c.DecodeSpeedupRatio <= 0 {
		c.DecodeSpeedupRatio = 1
	}
	if c.Timing == nil {
		c.Timing = Polynomial{}
	}
	if c.Digest == "" {
		c.Digest = fmt.Sprintf("sim:block=%d:layers=%d:payload=%d", c.BlockSize, c.Layers, c.PayloadSize)
	}
	switch {
	case !c.Role.Valid():
		return c, fmt.Errorf("sim config: unknown role %q (want aggregated, prefill or decode)", c.Role)
	case c.BlockSize < 1:
		return c, fmt.Errorf("sim config: block size %d, want ≥ 1", c.BlockSize)
	case c.Blocks < 1 || c.Blocks >= 1<<31:
		return c, fmt.Errorf("sim config: %d blocks, want 1 to 2^31-1", c.Blocks)
	case c.MaxBatchedTokens < 1:
		return c, fmt.Errorf("sim config: max batched tokens %d, want ≥ 1", c.MaxBatchedTokens)
	case c.MaxSeqs < 1:
		return c, fmt.Errorf("sim config: max seqs %d, want ≥ 1", c.MaxSeqs)
	case c.Watermark < 0 || c.Watermark >= 1:
		return c, fmt.Errorf("sim config: watermark %g, want in [0, 1)", c.Watermark)
	case c.Layers < 0 || c.PayloadSize < 0:
		return c, fmt.Errorf("sim config: %d layers × %d payload bytes, want both ≥ 0", c.Layers, c.PayloadSize)
	case int64(c.Blocks)*int64(c.Layers)*int64(c.PayloadSize) > 1<<34:
		return c, fmt.Errorf("sim config: payload slab of %d blocks × %d layers × %d bytes exceeds 16 GiB", c.Blocks, c.Layers, c.PayloadSize)
	case c.VocabSize < 1 || c.VocabSize > 1<<32-1:
		return c, fmt.Errorf("sim config: vocabulary size %d, want 1 to 2^32-1", c.VocabSize)
	case !tokensBelow(c.OutputTokens, c.VocabSize):
		return c, fmt.Errorf("sim config: an output token is outside the vocabulary of %d", c.VocabSize)
	case c.SpeedupRatio < 0:
		return c, fmt.Errorf("sim config: speedup ratio %g, want ≥ 0 (0 = no waiting)", c.SpeedupRatio)
	case c.DPSize < 1 || c.DPSize > 1024:
		return c, fmt.Errorf("sim config: dp size %d, want 1 to 1024", c.DPSize)
	case c.TransferBytesPerBlock < 0:
		return c, fmt.Errorf("sim config: transfer bytes per block %d, want ≥ 0", c.TransferBytesPerBlock)
	}
	if c.KVBM != nil {
		if err := c.KVBM.check(c); err != nil {
			return c, err
		}
	}
	return c, nil
}

// Missing is the part of a request's prompt the local cache lacks: the full
// blocks from index Start on.
type Missing struct {
	Start     int            // index of the first missing full block
	HasParent bool           // Start > 0
	Parent    kv.SeqHash     // sequence hash of block Start-1
	Local     []kv.LocalHash // local hashes of the missing blocks
	Seq       []kv.SeqHash   // their sequence hashes
}

// Inserter commits blocks fetched from elsewhere into a cache; Core and
// Engine implement it.
type Inserter interface {
	Insert(chain Chain) (int, error)
}

// Fetcher brings missing prefix blocks from elsewhere (a peer, a lower tier)
// and commits them with into.Insert. It is advisory: whatever it manages is
// reused, the rest is recomputed; its error is only counted. The Core calls
// it synchronously inside Add (with context.Background); the Engine calls
// it on the request's own goroutine with the request's context.
type Fetcher func(ctx context.Context, req *engine.Request, missing Missing, into Inserter) error

// EngineHash is the hash the sim names a block by in its KV events, and so
// in the hints that name it as a source and in peer fetches from it: its
// sequence hash.
func EngineHash(seq kv.SeqHash) kv.EngineHash { return kv.EngineHash(seq) }

// SeqOf is the sequence hash of the sim block named by engine hash e (see
// EngineHash). Only a sim's own engine hashes mean anything here: a hint's
// hashes are the source's, which is a sim only among sims.
func SeqOf(e kv.EngineHash) kv.SeqHash { return kv.SeqHash(e) }

// Chain is a run of consecutive blocks of one sequence to insert.
type Chain struct {
	HasParent bool       // false when Blocks[0] is a sequence's first block
	Parent    kv.SeqHash // sequence hash of the block before Blocks[0]; must be cached
	LoRA      string     // carried in the Stored event
	Salt      string     // the request's cache salt, carried in the Stored event
	Blocks    []BlockData
}

// BlockData is one block with its payload, as a peer serves it.
type BlockData struct {
	Local  kv.LocalHash
	Seq    kv.SeqHash
	Tokens []kv.Token // the block's tokens, or nil; carried in the Stored event
	Layers [][]byte   // Layers payload slices of PayloadSize bytes
	Sums   []uint64   // kv.Checksum of each layer as sent
}

func tokensBelow(toks []kv.Token, n int) bool {
	for _, t := range toks {
		if int64(t) >= int64(n) {
			return false
		}
	}
	return true
}
