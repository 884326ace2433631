package mockengine

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/transfer"
)

// blockPull is a consumer's pull of a prompt's blocks from the producer
// that computed them, as vLLM's and TensorRT-LLM's disaggregated stand-ins
// both do it.
type blockPull struct {
	addr   string   // the producer's side channel, host:port
	digest string   // the side channel's digest (sideDigest)
	ids    []uint64 // the producer's pool ids of the missing blocks (leadingIDs)
	// lora and salt are carried in the Stored events of the inserted
	// blocks ("" where the engine's events carry none).
	lora, salt string
}

// leadingIDs are a handoff's pool ids up to the first unknown (negative)
// one.
func leadingIDs[ID int32 | int64](ids []ID) []uint64 {
	out := make([]uint64, 0, len(ids))
	for _, id := range ids {
		if id < 0 {
			break
		}
		out = append(out, uint64(id))
	}
	return out
}

// pullBlocks fetches the blocks m lacks by the producer's pool ids, in the request's salt domain (the producer
// serves no block computed under another tenant's cache_salt), and
// inserts the verified prefix, every byte checked against the block's
// derivation. It returns the blocks inserted and asked for.
func pullBlocks(ctx context.Context, c *transfer.Client, p blockPull, req *engine.Request, m sim.Missing, sc sim.Config, into sim.Inserter) (inserted, wanted int, err error) {
	res, err := c.Fetch(ctx, "tcp://"+p.addr, transfer.FetchRequest{Hashes: p.ids, Digest: p.digest,
		Domain: kv.Seed(req.LoRA, req.CacheSalt)})
	defer res.Release()
	if len(res.Blocks) > 0 {
		bs := sc.BlockSize
		ch := sim.Chain{HasParent: m.HasParent, Parent: m.Parent, LoRA: p.lora, Salt: p.salt,
			Blocks: make([]sim.BlockData, 0, len(res.Blocks))}
		for i, b := range res.Blocks {
			layers, sums, lerr := b.Layers(sc.PayloadSize)
			if lerr != nil {
				err = errors.Join(err, lerr)
				break
			}
			at := (m.Start + i) * bs
			ch.Blocks = append(ch.Blocks, sim.BlockData{Local: m.Local[i], Seq: m.Seq[i],
				Tokens: req.Tokens[at : at+bs], Layers: layers, Sums: sums})
		}
		k, ierr := into.Insert(ch)
		inserted = k
		err = errors.Join(err, ierr)
	}
	return inserted, len(p.ids), err
}

// notifyProducer tells the producer at addr (host:port) that this consumer
// is done with requestID's blocks, once per handoff (done); sent is false
// when it was told already.
func notifyProducer(ctx context.Context, done *atomic.Bool, addr, requestID string) (sent bool, err error) {
	if done.Swap(true) {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	return true, Notify(ctx, addr, requestID, 1)
}
