package kv

import "sync/atomic"

// BlockHashes are the local and sequence hashes of a prompt's first full
// blocks of BlockSize tokens under Seed (Seed(LoRA, salt)): Local[i] and
// Seq[i] are block i's, as LocalHashes and SeqHashes make them. Read-only:
// the slices are shared.
type BlockHashes struct {
	Seed      uint64
	BlockSize int
	Local     []LocalHash
	Seq       []SeqHash
}

// Prefix is h for the full blocks of a prompt's first n tokens (views of
// h's slices; nil when none).
func (h *BlockHashes) Prefix(n int) *BlockHashes {
	if h == nil || h.BlockSize <= 0 {
		return nil
	}
	k := min(NumFullBlocks(n, h.BlockSize), len(h.Local), len(h.Seq))
	if k <= 0 {
		return nil
	}
	return &BlockHashes{Seed: h.Seed, BlockSize: h.BlockSize, Local: h.Local[:k:k], Seq: h.Seq[:k:k]}
}

// PromptHashes carry block hashes between prompts that share their first
// tokens by construction, in one process (never over the wire): a
// conversation's next turn, whose tokens the frontend's prefix cache
// copied from the turn before's, is routed hashing only the blocks past
// the ones routing hashed for that turn. Safe for concurrent use.
type PromptHashes struct {
	// Known are hashes of the prompt's first blocks made for an earlier
	// prompt whose tokens it starts with (nil: none).
	Known *BlockHashes
	kept  atomic.Pointer[BlockHashes]
}

// Keep records the prompt's block hashes as routing computed them, for
// the prompts that will start with its tokens.
func (p *PromptHashes) Keep(h BlockHashes) {
	if p != nil {
		p.kept.Store(&h)
	}
}

// Best is what is known of the prompt's block hashes: what routing kept,
// else what it started with.
func (p *PromptHashes) Best() *BlockHashes {
	if p == nil {
		return nil
	}
	if h := p.kept.Load(); h != nil {
		return h
	}
	return p.Known
}

// KnownHashes is p's Known (nil p: nil).
func (p *PromptHashes) KnownHashes() *BlockHashes {
	if p == nil {
		return nil
	}
	return p.Known
}
