package simpeer

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/transfer"
)

// PullHandoff is the engine's sim.HandoffPuller: a decode leg pulls the
// prompt blocks it lacks from the prefill rank named in the handoff, over
// the transfer protocol exactly as a hint's fetch does (the same client,
// checksums and payload verification), and inserts the longest verified
// prefix. The handoff names the prefill's blocks by engine hash; the blocks
// asked for are the leading missing blocks it names. A pull error, short
// answer or digest mismatch is returned: the engine counts it and
// recomputes the rest.
func (p *fetcher) PullHandoff(ctx context.Context, req *engine.Request, h *sim.Handoff, m sim.Missing, into sim.Inserter) (int, int64, error) {
	if p.eng == nil {
		return 0, 0, errors.New("peer: not attached to an engine")
	}
	if h.Digest != "" && h.Digest != p.digest {
		return 0, 0, fmt.Errorf("handoff from an engine with KV layout %q, this one is %q", h.Digest, p.digest)
	}
	want := hintedRun(m.Seq, h.Hashes)
	if want == 0 {
		return 0, 0, fmt.Errorf("handoff names none of the %d missing blocks", len(m.Seq))
	}
	ask := make([]uint64, want)
	for i := range ask {
		ask[i] = uint64(sim.EngineHash(m.Seq[i]))
	}
	ctx, sp := childSpan(ctx, "handoff.pull")
	res, ferr := p.h.Client().Fetch(ctx, h.Endpoint, transfer.FetchRequest{Hashes: ask, Digest: p.digest, Verify: p.verify})
	inserted, ierr := 0, error(nil)
	if len(res.Blocks) > 0 {
		inserted, ierr = into.Insert(p.chain(req, m, res.Blocks))
	}
	bytes := int64(inserted * p.layers * p.psize)
	if sp.IsRecording() {
		sp.SetAttributes(attribute.String("kvmesh.handoff.source", h.Endpoint), attribute.Int("kvmesh.blocks.wanted", want),
			attribute.Int("kvmesh.blocks.inserted", inserted), attribute.Int64("kvmesh.bytes", bytes))
	}
	endChild(sp, errors.Join(ferr, ierr, errShort(inserted, want)))
	p.log.Debug("disagg handoff pull", "request", req.ID, "source", h.Endpoint, "wanted", want,
		"received", len(res.Blocks), "inserted", inserted, "took", res.Duration, "err", errors.Join(ferr, ierr))
	if err := errors.Join(ferr, ierr); err != nil || inserted < want {
		return inserted, bytes, fmt.Errorf("handoff pull: %d of %d blocks inserted: %w", inserted, want, errors.Join(ferr, ierr, errShort(inserted, want)))
	}
	return inserted, bytes, nil
}

// ReleaseHandoff is the engine's DisaggConfig.Release: it tells the
// prefill rank that pinned h that this decode leg is done with it, over
// the transfer protocol's release frame. An older source refuses the frame
// and keeps its pin until the handoff's expiry.
func (p *fetcher) ReleaseHandoff(ctx context.Context, h *sim.Handoff) error {
	released, err := p.h.Client().Release(ctx, h.Endpoint, h.RequestID)
	p.log.Debug("disagg handoff release", "request", h.RequestID, "source", h.Endpoint, "released", released, "err", err)
	return err
}

func errShort(got, want int) error {
	if got < want {
		return fmt.Errorf("source sent %d of %d blocks", got, want)
	}
	return nil
}
