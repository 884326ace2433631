package mockengine

import (
	"context"
	"errors"
	"net"
	"strconv"
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

// poolIDs widens a handoff's block ids to decodeParams' kind.
func poolIDs(ids []int32) []int64 {
	out := make([]int64, len(ids))
	for i, id := range ids {
		out[i] = int64(id)
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

// decodeParams is a usable handoff: where the producer's blocks for a
// consumer request are (vLLM's do_remote_prefill kv_transfer_params,
// TensorRT-LLM's encoded_opaque_state, SGLang's bootstrap room answer).
type decodeParams struct {
	engineID  string
	requestID string // the producer's lease, named in the notification
	host      string
	port      int
	blockIDs  []int64 // the producer's pool ids, prompt order (one KV-cache group)
}

func (p *decodeParams) addr() string { return net.JoinHostPort(p.host, strconv.Itoa(p.port)) }

// pullState is one consumer request's handoff, looked up by the sim's
// Fetcher under the request's engine id.
type pullState struct {
	p         decodeParams
	attempted atomic.Bool
	notified  atomic.Bool
}

// fetch is the sim's Fetcher: for a request with a handoff it pulls the
// missing prompt blocks by the producer's block ids over its side
// channel, inserts them (the sim checks every byte against the block's
// own derivation), and notifies the producer. Whatever fails is
// recomputed; the producer's lease then frees its blocks.
func (c *core) fetch(ctx context.Context, req *engine.Request, m sim.Missing, into sim.Inserter) error {
	val, ok := c.pulls.Load(req.ID)
	if !ok {
		return nil
	}
	ps := val.(*pullState)
	ps.attempted.Store(true)
	n := min(len(m.Seq), len(ps.p.blockIDs)-m.Start)
	if n <= 0 {
		// Nothing the producer holds is missing here: only notify.
		c.pull.localHits.Add(1)
		c.notify(ctx, ps)
		return nil
	}
	// An engine whose requests carry no LoRA or cache_salt (TensorRT-LLM)
	// inserts blocks whose events name none.
	inserted, wanted, err := pullBlocks(ctx, c.client, blockPull{addr: ps.p.addr(), digest: sideDigest(ps.p.engineID, c.sc.Digest),
		ids: leadingIDs(ps.p.blockIDs[m.Start : m.Start+n]), lora: req.LoRA, salt: req.CacheSalt}, req, m, c.sc, into)
	c.pull.blocks.Add(uint64(inserted))
	if err != nil {
		c.pull.failed.Add(1)
		if re := (*transfer.RemoteError)(nil); errors.As(err, &re) && re.Code == transfer.CodeNotFound {
			c.pull.notHeld.Add(1)
		}
		c.log.Warn("kv pull failed; recomputing the rest", "request", req.ID, "remote_request", ps.p.requestID,
			"pulled", inserted, "wanted", wanted, "err", err)
		return err
	}
	c.pull.ok.Add(1)
	c.notify(ctx, ps)
	return nil
}

// notify tells the producer that this consumer is done with the handoff's
// blocks, once.
func (c *core) notify(ctx context.Context, ps *pullState) {
	sent, err := notifyProducer(ctx, &ps.notified, ps.p.addr(), ps.p.requestID)
	switch {
	case !sent:
	case err != nil:
		c.pull.notifyFailed.Add(1)
		c.log.Warn("kv notification failed; the producer frees its blocks when the lease runs out",
			"remote_request", ps.p.requestID, "err", err)
	default:
		c.pull.notified.Add(1)
	}
}

// afterPrefill notifies a consumer's producer when the sim never called
// the Fetcher (every full prompt block was cached here, the prompt has
// none, or nothing was left to generate): vLLM's full-prefix-hit path
// sends only the notification.
func (c *core) afterPrefill(ctx context.Context, ps *pullState) {
	if ps == nil || ps.attempted.Load() {
		return
	}
	c.pull.localHits.Add(1)
	c.notify(ctx, ps)
}
