package twin

import (
	"context"
	"fmt"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
)

// fetch is every core's Fetcher in kv+hints mode: when the request being
// added carries a hint (req.KVHint), it copies the hinted blocks the target lacks from
// the source core — pinned while read, payloads checksummed as a transfer
// would send them, verified byte for byte by the target's Insert.
func (t *twin) fetch(_ context.Context, req *engine.Request, m sim.Missing, into sim.Inserter) error {
	h := req.KVHint
	if h == nil || len(m.Seq) == 0 {
		return nil
	}
	hs := &t.res.Hints
	src := int(h.Source.Instance) - 1
	if src < 0 || src >= len(t.ws) {
		hs.Errors++
		return fmt.Errorf("twin: hint names unknown source %v", h.Source)
	}
	end := min(len(h.Hashes), m.Start+len(m.Seq))
	if end <= m.Start {
		hs.Misses++ // the target already holds all the source has
		return nil
	}
	// The hint names the source's blocks by its engine hashes; among sims
	// those are the prompt's sequence hashes.
	if h.Hashes[m.Start] != sim.EngineHash(m.Seq[0]) {
		hs.Errors++
		return fmt.Errorf("twin: hint block %d is %016x, the prompt's is %016x", m.Start, h.Hashes[m.Start], m.Seq[0])
	}
	c := &t.copier
	c.pin = c.pin[:0]
	for _, e := range h.Hashes[:end] {
		c.pin = append(c.pin, sim.SeqOf(e))
	}
	core := t.ws[src].core
	held, release := core.Pin(c.pin)
	defer release()
	end = min(end, held)
	if end <= m.Start {
		hs.Misses++ // the source evicted them since it reported them
		return nil
	}
	n, payload, err := t.copier.copy(core, src, m, end-m.Start, into)
	hs.FetchedBlocks += int64(n)
	hs.ModelledBytes += int64(n) * t.cfg.TransferBytesPerBlock
	hs.PayloadBytes += int64(payload)
	if err != nil {
		hs.Errors++
	}
	return err
}

// blockCopier copies blocks between cores as a transfer would; its
// buffers are reused from copy to copy.
type blockCopier struct {
	pin  []kv.SeqHash // the hinted blocks as the source sim's sequence hashes
	pbuf []byte
	sums []uint64
	lay  [][]byte
	blks []sim.BlockData
}

// copy copies the first nb blocks of m from core (worker src) into into:
// each layer's payload read, checksummed as a transfer would send it and
// verified byte for byte by Insert. It returns the blocks inserted and the
// payload bytes they carried.
func (t *blockCopier) copy(core *sim.Core, src int, m sim.Missing, nb int, into sim.Inserter) (int, int, error) {
	sc := core.Config()
	layers, psize := sc.Layers, sc.PayloadSize
	if need := nb * layers * psize; cap(t.pbuf) < need {
		t.pbuf = make([]byte, need)
	}
	if cap(t.sums) < nb*layers {
		t.sums = make([]uint64, nb*layers)
		t.lay = make([][]byte, nb*layers)
	}
	t.blks = t.blks[:0]
	for b := 0; b < nb; b++ {
		seq := m.Seq[b]
		for l := 0; l < layers; l++ {
			k := b*layers + l
			buf := t.pbuf[k*psize : (k+1)*psize]
			if _, err := core.ReadPayload(seq, l, buf); err != nil {
				return 0, 0, fmt.Errorf("twin: read block from worker %d: %w", src+1, err)
			}
			t.sums[k] = kv.Checksum(buf)
			t.lay[k] = buf
		}
		t.blks = append(t.blks, sim.BlockData{Local: m.Local[b], Seq: seq,
			Layers: t.lay[b*layers : (b+1)*layers], Sums: t.sums[b*layers : (b+1)*layers]})
	}
	n, err := into.Insert(sim.Chain{HasParent: m.HasParent, Parent: m.Parent, Blocks: t.blks})
	if err != nil {
		err = fmt.Errorf("twin: insert blocks from worker %d: %w", src+1, err)
	}
	return n, n * layers * psize, err
}
