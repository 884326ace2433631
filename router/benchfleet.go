package router

import (
	"fmt"
	"math/rand/v2"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/kv"
)

// BenchFleet is a warm fleet for measuring routing overhead: an event
// index where every worker holds varied prefixes of a set of prompts (on
// varied tiers), and a kv-mode router over it.
type BenchFleet struct {
	Router  *Router
	Index   *index.Index
	Prompts [][]kv.Token
}

// BenchFleetConfig sizes a BenchFleet.
type BenchFleetConfig struct {
	Workers       int    // default 64
	PromptTokens  int    // default 8192
	Prompts       int    // distinct prompts, default 32
	BlockSize     int    // default 16
	HeldPerWorker int    // prompts each worker holds a prefix of, default 8
	Seed          uint64 // default 1
}

// NewBenchFleet builds the fleet; the router uses cfg with Matcher set to
// the fleet's index (cfg.Mode defaults to kv).
func NewBenchFleet(bc BenchFleetConfig, cfg Config) (*BenchFleet, error) {
	bc = bc.withDefaults()
	rng := rand.New(rand.NewPCG(bc.Seed, 0x6b766d657368))
	prompts := benchPrompts(bc, rng)
	ix := index.New()
	cfg.Matcher = ix
	if cfg.Rand == nil {
		cfg.Rand = rand.New(rand.NewPCG(bc.Seed, 1))
	}
	r, err := New(cfg)
	if err != nil {
		return nil, err
	}
	h := kv.NewHasher(bc.BlockSize, "", "")
	for w := 0; w < bc.Workers; w++ {
		key := kv.WorkerKey{Instance: uint64(0x1000 + w/2), DPRank: uint32(w % 2)}
		err := r.AddWorker(WorkerInfo{Key: key, Model: "bench", BlockSize: bc.BlockSize,
			KVBlocks: 1 << 20, MaxBatchedTokens: 8192, Digest: "bench",
			ControlEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", 30000+w), HintCapable: true})
		if err != nil {
			return nil, err
		}
		for k := 0; k < bc.HeldPerWorker; k++ {
			p := prompts[rng.IntN(len(prompts))]
			n := rng.IntN(len(p) + 1)
			local, seq := h.Blocks(p[:n])
			if len(local) == 0 {
				continue
			}
			blocks := make([]kv.StoredBlock, len(local))
			for i := range local {
				blocks[i] = kv.StoredBlock{EngineHash: kv.EngineHash(seq[i]), LocalHash: local[i]}
			}
			tier := kv.TierDevice
			if x := rng.IntN(4); x == 2 {
				tier = kv.TierHost
			} else if x == 3 {
				tier = kv.TierDisk
			}
			ix.Apply(kv.Stored(key, tier, nil, blocks))
		}
	}
	return &BenchFleet{Router: r, Index: ix, Prompts: prompts}, nil
}

func (bc BenchFleetConfig) withDefaults() BenchFleetConfig {
	if bc.Workers <= 0 {
		bc.Workers = 64
	}
	if bc.PromptTokens <= 0 {
		bc.PromptTokens = 8192
	}
	if bc.Prompts <= 0 {
		bc.Prompts = 32
	}
	if bc.BlockSize <= 0 {
		bc.BlockSize = 16
	}
	if bc.HeldPerWorker <= 0 {
		bc.HeldPerWorker = 8
	}
	if bc.Seed == 0 {
		bc.Seed = 1
	}
	return bc
}

// benchPrompts draws the fleet's prompts: they share a common system
// prefix (an eighth) and then diverge, as chat traffic does.
func benchPrompts(bc BenchFleetConfig, rng *rand.Rand) [][]kv.Token {
	shared := bc.PromptTokens / 8
	prompts := make([][]kv.Token, bc.Prompts)
	for i := range prompts {
		p := make([]kv.Token, bc.PromptTokens)
		for j := range p {
			if j < shared {
				p[j] = kv.Token(j)
			} else {
				p[j] = kv.Token(rng.Uint32() % 200_000)
			}
		}
		prompts[i] = p
	}
	return prompts
}
