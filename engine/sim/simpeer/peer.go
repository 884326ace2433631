// Package simpeer is the sim's side of peer KV transfer: the fetcher that
// consumes a request's kv.fetch hint, the decode leg's handoff pull and
// release, and the sim's caches as transfer block sources. It works through
// the worker's Peer (Host), which owns the transfer client, the hint
// results and the control endpoints; the worker itself knows engines only
// through package engine.
//
// It imports engine, engine/sim, transfer and kv.
package simpeer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/transfer"
)

// Hint results a fetch ends in (the worker's HintFetched, HintPartial,
// HintFallback and HintUnused).
const (
	hintFetched  = "fetched"
	hintPartial  = "partial"
	hintFallback = "fallback"
	hintUnused   = "unused"
)

// Host is the worker's side of peer transfer as the sim uses it
// (worker.Peer).
type Host interface {
	// Attach installs the engine's caches, before it can fetch.
	Attach(transfer.RankSources)
	// Serving: the worker serves the engine's blocks to peers.
	Serving() bool
	Client() *transfer.Client
	// IsSelf: ep is the requesting rank's own control endpoint.
	IsSelf(ep string, rank int) bool
	// Endpoint is rank r's advertised control endpoint, or "".
	Endpoint(r int) string
	// HintEnded counts how the hint of the request whose context is ctx
	// ended.
	HintEnded(ctx context.Context, result string)
	// Inserted counts what fetches inserted.
	Inserted(blocks, bytes int)
	Logger() *slog.Logger
}

// New starts a simulated engine whose fetcher and handoff puller work
// through h, and attaches its caches to h. A serving host's engine keeps
// each block's checksum from when it was stored (sim.Config.StoreChecksums),
// which the server then sends.
func New(cfg sim.Config, h Host) (*sim.Engine, error) {
	f := &fetcher{h: h, log: h.Logger()}
	cfg.Fetcher = f.Fetch
	cfg.Disagg.Puller = f.PullHandoff
	cfg.Disagg.Release = f.ReleaseHandoff
	if cfg.Disagg.Endpoint == nil {
		cfg.Disagg.Endpoint = h.Endpoint
	}
	if h.Serving() {
		// Served blocks carry the checksums taken when they were stored.
		cfg.StoreChecksums = true
	}
	eng, err := sim.New(cfg)
	if err != nil {
		return nil, err
	}
	c := eng.SimConfig()
	f.eng, f.bs, f.layers, f.psize, f.digest = eng, c.BlockSize, c.Layers, c.PayloadSize, c.Digest
	f.verify = transfer.PayloadVerifier(c.Layers, c.PayloadSize)
	h.Attach(Caches{eng})
	return eng, nil
}

// Caches are a sim's ranks as transfer block sources.
type Caches struct{ E *sim.Engine }

var _ transfer.RankSources = Caches{}

// DPSize is the engine's data-parallel ranks.
func (c Caches) DPSize() int { return c.E.DPSize() }

// RankSource is rank r's cache, or nil if the engine has no rank r.
func (c Caches) RankSource(r int) transfer.BlockSource {
	if e := c.E.Rank(r); e != nil {
		return NewSimSource(e)
	}
	return nil
}

// Digest is the engine's KV layout digest.
func (c Caches) Digest() string { return c.E.SimConfig().Digest }

// fetcher is the engine's sim.Fetcher and handoff puller.
//
// Timing, so TTFT comparisons stay honest: the fetch runs on the request's
// goroutine before it is queued, so the real loopback transfer time is
// spent in wall time (it is part of the TTFT a client measures); then the
// sim charges the fetched blocks in the prefill pass that admits the
// request, TransferBytesPerBlock (default: the sim's own payload size) over
// TransferBandwidth, divided like every pass by SpeedupRatio. Both costs
// are paid; neither is hidden. The twin prices transfers in virtual time
// only.
type fetcher struct {
	h   Host
	log *slog.Logger

	// Set once by New, before the engine can call Fetch.
	eng               *sim.Engine
	bs, layers, psize int
	digest            string
	verify            func(hash uint64, payload []byte) error
}

// Fetch is the engine's sim.Fetcher. missing is the run of full prompt
// blocks the engine lacks; the hint (validated where it entered the worker)
// names the source's blocks by the source's engine hashes, so the blocks to
// fetch are the leading missing blocks whose engine hashes, were the source
// a sim like this one (sim.EngineHash), the hint names, and they are asked
// of the source by those hashes. The fetch is bounded by the operation
// timeout and by ctx (the request's), and its error is advisory: the
// engine counts it and recomputes what was not inserted.
func (p *fetcher) Fetch(ctx context.Context, req *engine.Request, m sim.Missing, into sim.Inserter) error {
	h := req.KVHint
	if h == nil || p.eng == nil {
		return nil
	}
	if p.h.IsSelf(h.Endpoint, req.DPRank) {
		p.h.HintEnded(ctx, hintUnused)
		return nil
	}
	want := hintedRun(m.Seq, h.Hashes)
	if want == 0 {
		p.h.HintEnded(ctx, hintUnused)
		return nil
	}
	ask := make([]uint64, want)
	for i := range ask {
		ask[i] = uint64(sim.EngineHash(m.Seq[i]))
	}
	ctx, sp := childSpan(ctx, "hint.fetch")
	res, ferr := p.h.Client().Fetch(ctx, h.Endpoint, transfer.FetchRequest{Hashes: ask, Digest: p.digest, Verify: p.verify,
		Domain: kv.Seed(req.LoRA, req.CacheSalt)})
	inserted, ierr := 0, error(nil)
	if len(res.Blocks) > 0 {
		inserted, ierr = into.Insert(p.chain(req, m, res.Blocks))
	}
	if sp.IsRecording() {
		sp.SetAttributes(attribute.String("kvmesh.hint.source", h.Endpoint), attribute.Int("kvmesh.blocks.wanted", want),
			attribute.Int("kvmesh.blocks.inserted", inserted), attribute.Int64("kvmesh.bytes", int64(inserted*p.layers*p.psize)),
			attribute.String("kvmesh.transfer.outcome", res.Outcome.String()))
	}
	endChild(sp, errors.Join(ferr, ierr))
	switch {
	case inserted == want:
		p.h.HintEnded(ctx, hintFetched)
	case inserted > 0:
		p.h.HintEnded(ctx, hintPartial)
	default:
		p.h.HintEnded(ctx, hintFallback)
	}
	p.h.Inserted(inserted, inserted*p.layers*p.psize)
	p.log.Debug("kv hint fetch", "request", req.ID, "source", h.Endpoint, "wanted", want,
		"received", len(res.Blocks), "inserted", inserted, "outcome", res.Outcome.String(), "took", res.Duration, "err", errors.Join(ferr, ierr))
	if ferr != nil || ierr != nil {
		return fmt.Errorf("kv hint: %d of %d blocks inserted: %w", inserted, want, errors.Join(ferr, ierr))
	}
	return nil
}

// hintedRun counts the leading missing blocks the hint names. Membership,
// not position: a router may send the root-aligned prefix or a suffix.
func hintedRun(missing []kv.SeqHash, hinted []kv.EngineHash) int {
	if len(missing) == 0 || len(hinted) == 0 {
		return 0
	}
	set := make(map[kv.EngineHash]struct{}, len(hinted))
	for _, h := range hinted {
		set[h] = struct{}{}
	}
	n := 0
	for n < len(missing) {
		if _, ok := set[sim.EngineHash(missing[n])]; !ok {
			break
		}
		n++
	}
	return n
}

// chain turns a verified contiguous prefix of missing blocks into a sim
// Chain. Payloads are aliased: Insert copies them into the pool.
func (p *fetcher) chain(req *engine.Request, m sim.Missing, blocks []transfer.Block) sim.Chain {
	ch := sim.Chain{HasParent: m.HasParent, Parent: m.Parent, LoRA: req.LoRA, Salt: req.CacheSalt, Blocks: make([]sim.BlockData, len(blocks))}
	for i, b := range blocks {
		bd := sim.BlockData{Local: m.Local[i], Seq: m.Seq[i], Layers: make([][]byte, p.layers), Sums: make([]uint64, p.layers)}
		if lo, hi := (m.Start+i)*p.bs, (m.Start+i+1)*p.bs; hi <= len(req.Tokens) {
			bd.Tokens = req.Tokens[lo:hi:hi]
		}
		for l := range p.layers {
			bd.Layers[l] = b.Payload[l*p.psize : (l+1)*p.psize : (l+1)*p.psize]
			bd.Sums[l] = kv.Checksum(bd.Layers[l])
		}
		ch.Blocks[i] = bd
	}
	return ch
}

const tracerScope = "github.com/kvmesh/kvmesh"

// childSpan starts a span under ctx's when that one records; otherwise it
// returns ctx and its non-recording span (End does nothing). Callers set
// attributes only on a recording span: building them allocates.
func childSpan(ctx context.Context, name string) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, parent
	}
	return parent.TracerProvider().Tracer(tracerScope).Start(ctx, name)
}

// endChild ends a child span with err's status, if any.
func endChild(sp trace.Span, err error) {
	if err != nil && sp.IsRecording() {
		sp.RecordError(err)
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}
