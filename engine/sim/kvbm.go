package sim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/kvmesh/kvmesh/clock"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/internal/u64map"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/kvbm"
	"github.com/kvmesh/kvmesh/kvbm/blobtier"
)

// The sim behind a KV block manager (Config.KVBM): host, disk and object tiers
// (package kvbm) behind the device pool, driven the way TensorRT-LLM's
// executor drives its KV cache connector. Per pass:
//
//   - admitting a request asks the leader for external matches
//     (GetNumNewMatchedTokens with the device hit), allocates blocks for
//     the device hit and the matched tokens (without a match, the first
//     chunk's), and reports the allocation (UpdateStateAfterAlloc);
//   - the pass's scheduler output (new and cached requests with their new
//     block ids, computed position and num_scheduled_tokens) builds the
//     connector metadata, which the worker binds before the forward pass:
//     loads run then, writing real bytes into the device blocks, verified;
//   - the pass is priced with the onboarded bytes at the host→device and
//     disk→device bandwidths; a block whose load failed is recomputed in
//     the same pass (its tokens priced as prefill);
//   - after the forward pass the stores run (WaitForSave, GetFinished):
//     every block the pass completed is written through to host (and to
//     disk through the frequency filter);
//   - a finished or aborted request is reported (RequestFinished).
//
// Loads are asynchronous, as TensorRT-LLM's and vLLM's are (vLLM parks the
// request in WAITING_FOR_REMOTE_KVS): a request admitted with matched
// blocks takes no tokens of the pass that admits it; its load is timed on
// one host/disk→device channel (loads queue behind each other) that
// overlaps the other requests' forward passes, and it is scheduled in the
// first pass that starts after its load lands. The bytes themselves move
// when the metadata is bound, so the device holds them from then on.
//
// The tiers' KV events join the core's own stream (one numbering per
// worker key), after the device events of the same call.

// Onboarding bandwidth defaults, bytes/s: PCIe 5.0 ×16 pinned host copies
// and one PCIe 4.0 NVMe drive's sequential reads.
const (
	DefaultHostBandwidth = 50e9
	DefaultDiskBandwidth = 7e9
	// DefaultObjectBandwidth is a 25 GbE link's sustained object reads.
	DefaultObjectBandwidth = 3e9
)

// KVBMConfig shapes the block manager behind a Core.
type KVBMConfig struct {
	HostBlocks int // host tier (G2) blocks; 0: none
	DiskBlocks int // disk tier (G3) blocks; 0: none (with no host tier: bypass host)
	// DiskDir holds the disk tier's pool file, one per worker key
	// (kvbm-<instance>-<rank>.g3). A file left there by a worker with the
	// same key and geometry is recovered: blocks verified, corrupt ones
	// dropped, the rest announced.
	DiskDir string
	// HostBandwidth and DiskBandwidth (bytes/s) price onboarding; 0 takes
	// the defaults, < 0 makes it free.
	HostBandwidth, DiskBandwidth float64
	// ObjectURL is the object tier's bucket (G4, kvbm/blobtier: file:///dir,
	// mem:// or s3://bucket[/prefix]?region=…) and ObjectBlocks its capacity: what the last local tier
	// evicts goes there, under the prefix kvbm/<instance>-<rank>/; a
	// worker with the same key recovers what it finds there at start.
	ObjectURL    string
	ObjectBlocks int
	// ObjectQueue is how many evicted blocks may wait for their object
	// writes, staged in memory, while writer goroutines put them (a full
	// queue drops the object copy, counted); 0 writes synchronously,
	// inside the step that evicts (the twin's deterministic mode).
	ObjectQueue int
	// ObjectBandwidth prices object→device onboarding (bytes/s; 0: the
	// default, < 0: free).
	ObjectBandwidth float64
	// RecomputePerToken is the prefill cost per token the connector weighs
	// a tier load against (kvbm.LoadCost): a match is loaded only as far
	// as loading beats recomputing, onboarding backlog included. 0 loads
	// every match; RecomputeAuto takes the timing model's (RecomputeCost).
	RecomputePerToken time.Duration
	// DiskFilter is the host→disk frequency filter.
	DiskFilter kvbm.FilterConfig
	// Clock drives the disk filter's decay (nil: wall time).
	Clock clock.Clock
}

// KVBMStats are a Core's block-manager totals.
type KVBMStats struct {
	kvbm.Stats
	HostTokens, DiskTokens uint64 // prompt tokens onboarded from each tier at first admission
	ObjectTokens           uint64
	OnboardBytes           uint64 // modelled bytes onboarded (every admission)
	LoadFailures           uint64 // blocks recomputed because their load failed
	RecoveredCorrupt       int    // disk and object blocks dropped by recovery
	ConnectorErrors        uint64 // connector calls that failed (a bug or I/O error; the block is recomputed or left uncached)
}

// kbCore is a Core's block manager and connector.
type kbCore struct {
	c      *Core
	mgr    *kvbm.Manager
	conn   *kvbm.Connector
	lead   *kvbm.TRTLLMLeader
	wk     *kvbm.Worker
	disk   *kvbm.DiskFile
	obj    *blobtier.Store
	async  *blobtier.Async // ObjectQueue > 0: obj's writer
	bpb    float64         // modelled bytes per block
	hostBW float64
	diskBW float64
	objBW  float64
	next   uint64

	out     kvbm.TRTLLMSchedulerOutput
	ids     []kvbm.DeviceBlockID
	loading []*Seq // admitted this pass with a load to start
	// loadq is the admitted requests whose load is in flight, in load
	// order; loadFree is when the load channel is next free, loadScale
	// the factor from modelled to clock time (the Engine's 1/speedup).
	loadq     []*Seq
	loadFree  time.Time
	loadScale float64
	now       time.Time  // the pass being scheduled (the backlog's reference)
	held      []kv.Event // tier events emitted before any sink (recovery)
	holding   bool
	// domains is the salt domain of every block a tier holds, taken from
	// the device pool when the block was stored there, so the tiers'
	// blocks are served to peers only within their domain (BlockDomain).
	// Blocks recovered from disk have none: they are not served to peers.
	domains u64map.Map[kv.SeqHash, uint64]
	st      KVBMStats
	lastErr error
}

// kbReq is one request's connector state in the Core.
type kbReq struct {
	id         string
	isNew      bool // admitted since the last pass: the next output lists it as new
	told       int  // table entries the connector knows
	counted    bool // first admission's onboarding counted
	host, disk int  // tokens onboarded so far (cumulative, as the slot counts)
	obj        int
	// A match not yet allocated (the request waits for blocks): at device
	// hit matchedAt, matched tokens, still pinned in the tiers.
	matchedAt, matched int
	staged             bool
	ready              time.Time // when its load lands (stLoading)
}

func (cfg *KVBMConfig) check(c Config) error {
	k := cfg
	switch {
	case k.HostBlocks < 0 || k.DiskBlocks < 0:
		return fmt.Errorf("sim config: kvbm %d host and %d disk blocks, want ≥ 0", k.HostBlocks, k.DiskBlocks)
	case k.HostBlocks == 0 && k.DiskBlocks == 0:
		return errors.New("sim config: kvbm needs host or disk blocks")
	case k.DiskBlocks > 0 && k.DiskDir == "":
		return errors.New("sim config: kvbm disk blocks need a disk directory")
	case k.ObjectBlocks < 0 || (k.ObjectBlocks > 0) != (k.ObjectURL != ""):
		return fmt.Errorf("sim config: kvbm object tier of %d blocks at %q: give both or neither", k.ObjectBlocks, k.ObjectURL)
	case k.ObjectQueue < 0:
		return fmt.Errorf("sim config: kvbm object queue of %d blocks, want ≥ 0", k.ObjectQueue)
	case c.Role == kv.RoleDecode:
		return errors.New("sim config: kvbm runs on prefill and aggregated workers only: a decode worker's prompt KV comes from its prefill peer")
	case c.Layers*c.PayloadSize == 0:
		return errors.New("sim config: kvbm needs payload bytes (layers × payload size > 0) to move")
	}
	return nil
}

func newKB(c *Core) (*kbCore, error) {
	cfg := *c.cfg.KVBM
	bb := c.cfg.Layers * c.cfg.PayloadSize
	k := &kbCore{c: c, loadScale: 1, hostBW: cfg.HostBandwidth, diskBW: cfg.DiskBandwidth, domains: u64map.New[kv.SeqHash, uint64](1024)}
	if k.hostBW == 0 {
		k.hostBW = DefaultHostBandwidth
	}
	if k.diskBW == 0 {
		k.diskBW = DefaultDiskBandwidth
	}
	if k.objBW = cfg.ObjectBandwidth; k.objBW == 0 {
		k.objBW = DefaultObjectBandwidth
	}
	k.bpb = float64(c.xferPer)
	mc := kvbm.Config{BlockSize: c.bs, BlockBytes: bb, Clock: cfg.Clock, DiskFilter: cfg.DiskFilter,
		Worker: c.cfg.Worker, Events: k.events}
	if cfg.HostBlocks > 0 {
		h, err := kvbm.NewHostArena(cfg.HostBlocks, bb)
		if err != nil {
			return nil, err
		}
		mc.Host = h
	}
	if cfg.DiskBlocks > 0 {
		if err := os.MkdirAll(cfg.DiskDir, 0o755); err != nil {
			return nil, fmt.Errorf("sim: kvbm disk dir: %w", err)
		}
		name := fmt.Sprintf("kvbm-%016x-%d.g3", c.cfg.Worker.Instance, c.cfg.Worker.DPRank)
		d, err := kvbm.OpenDiskFile(filepath.Join(cfg.DiskDir, name), cfg.DiskBlocks, bb)
		if err != nil {
			return nil, err
		}
		k.disk, mc.Disk = d, d
	}
	if cfg.ObjectBlocks > 0 {
		prefix := fmt.Sprintf("kvbm/%016x-%d/", c.cfg.Worker.Instance, c.cfg.Worker.DPRank)
		o, err := blobtier.Open(context.Background(), cfg.ObjectURL, prefix, cfg.ObjectBlocks, bb)
		if err != nil {
			k.close()
			return nil, err
		}
		k.obj, mc.Object = o, o
		if cfg.ObjectQueue > 0 {
			a, err := blobtier.NewAsync(o, blobtier.AsyncConfig{Depth: cfg.ObjectQueue, Drain: objectDrain})
			if err != nil {
				k.close()
				return nil, err
			}
			k.async, mc.Object = a, a
		}
	}
	m, err := kvbm.NewManager(mc)
	if err != nil {
		k.close()
		return nil, err
	}
	k.mgr = m
	if k.disk != nil && k.disk.Reopened {
		k.holding = true
		_, corrupt, err := m.RecoverDisk()
		k.holding = false
		k.st.RecoveredCorrupt = corrupt
		if err != nil {
			k.close()
			return nil, fmt.Errorf("sim: kvbm recover %s: %w", k.disk.Path(), err)
		}
	}
	if k.obj != nil {
		k.holding = true
		_, corrupt, err := m.RecoverObject()
		k.holding = false
		k.st.RecoveredCorrupt += corrupt
		if err != nil {
			k.close()
			return nil, fmt.Errorf("sim: kvbm recover the object tier: %w", err)
		}
	}
	k.conn = kvbm.NewConnector(m)
	rc := cfg.RecomputePerToken
	if rc == RecomputeAuto {
		rc = RecomputeCost(c.cfg.Timing, c.cfg.MaxBatchedTokens)
	}
	if rc > 0 {
		var per [kv.NumTiers]time.Duration
		for t, ms := range tierLoadMS(k.bpb, k.hostBW, k.diskBW, k.objBW) {
			per[t] = msToDuration(ms)
		}
		k.conn.SetLoadCost(kvbm.LoadCost{PerBlock: per, RecomputeToken: rc}, func() time.Duration { return c.OnboardBacklog(k.now) })
	}
	k.lead = k.conn.TRTLLMLeader()
	k.wk = k.conn.Worker(simDevice{c})
	k.out.NumScheduledTokens = map[string]int{}
	return k, nil
}

func (k *kbCore) close() error {
	var errs []error
	if k.disk != nil {
		errs = append(errs, k.disk.Close())
		k.disk = nil
	}
	switch {
	case k.async != nil:
		errs = append(errs, k.async.Close()) // closes obj too
	case k.obj != nil:
		errs = append(errs, k.obj.Close())
	}
	k.obj, k.async = nil, nil
	return errors.Join(errs...)
}

// events puts the tiers' events into the core's stream, renumbered; before
// a sink is installed, recovery's are held for it.
func (k *kbCore) events(batch []kv.Event) {
	k.trackDomains(batch)
	if k.holding {
		k.held = append(k.held, batch...)
		return
	}
	k.c.ev.external(batch)
}

// external appends events made elsewhere (the block manager's tiers) to
// the pending batch, numbered in this log's sequence.
func (l *eventLog) external(evs []kv.Event) {
	if l.sink == nil {
		return
	}
	l.close()
	for _, e := range evs {
		l.nextID++
		e.ID, e.Worker = l.nextID, l.worker
		l.events = append(l.events, e)
	}
}

// trackDomains records the salt domain of blocks the tiers store and
// forgets those no tier holds any more.
func (k *kbCore) trackDomains(batch []kv.Event) {
	for _, e := range batch {
		switch e.Kind {
		case kv.EventStored:
			for _, b := range e.Blocks {
				seq := SeqOf(b.EngineHash)
				if id, ok := k.c.pool.byHash.Get(seq); ok {
					k.domains.Set(seq, k.c.pool.domains[id])
				}
			}
		case kv.EventRemoved:
			for _, h := range e.Removed {
				seq := SeqOf(h)
				if k.mgr == nil {
					k.domains.Delete(seq)
				} else if host, disk := k.mgr.Holds(seq); !host && !disk && !k.mgr.HoldsObject(seq) {
					k.domains.Delete(seq)
				}
			}
		}
	}
}

// sinkInstalled delivers the held recovery events to a new sink.
func (k *kbCore) sinkInstalled() {
	if len(k.held) == 0 || k.c.ev.sink == nil {
		return
	}
	held := k.held
	k.held = nil
	k.c.ev.external(held)
	k.c.ev.flush()
}

func (k *kbCore) fail(err error) {
	if err != nil {
		k.st.ConnectorErrors++
		k.lastErr = err
	}
}

// request is the connector's view of s: given by hashes, every known token.
func (k *kbCore) request(s *Seq) *kvbm.Request {
	return &kvbm.Request{ID: s.kb.id, LoRA: s.req.LoRA, Salt: s.req.CacheSalt, Len: s.total(), Local: s.local}
}

// match is GetNumNewMatchedTokens at admission: the tokens the tiers can
// supply beyond the device's computed ones (whole blocks).
func (k *kbCore) match(s *Seq, computed int) int {
	if s.kb == nil {
		k.next++
		s.kb = &kbReq{id: strconv.FormatUint(k.next, 36)}
	}
	q := s.kb
	if q.staged && q.matchedAt == computed {
		// Still waiting for blocks with the same device hit: the match
		// is still pinned, no need to walk the tiers again.
		return q.matched
	}
	n, _, err := k.lead.GetNumNewMatchedTokens(k.request(s), computed)
	if err != nil {
		k.fail(err)
		return 0
	}
	q.staged, q.matchedAt, q.matched = true, computed, n
	return n
}

// allocated is UpdateStateAfterAlloc once s's table holds the device hit,
// the matched blocks and its first chunk's.
func (k *kbCore) allocated(s *Seq, contextPos, ext int) {
	s.kb.isNew, s.kb.told, s.kb.staged = true, len(s.table), false
	if err := k.lead.UpdateStateAfterAlloc(s.kb.id, k.blockIDs(s.table), contextPos); err != nil {
		k.fail(err)
	}
	if ext > 0 {
		s.st = stLoading
		k.loading = append(k.loading, s)
		k.loadq = append(k.loadq, s)
	}
}

func (k *kbCore) blockIDs(t []int32) []kvbm.DeviceBlockID {
	k.ids = k.ids[:0]
	for _, id := range t {
		k.ids = append(k.ids, kvbm.DeviceBlockID(id))
	}
	return k.ids
}

// bind builds the pass's scheduler output and binds its metadata: loads
// start now, on one host/disk→device channel that overlaps the forward
// pass; a request admitted with a load runs in the first pass that starts
// after its load lands, computing from the first block whose load failed.
func (k *kbCore) bind(sched []schedEntry, now time.Time) {
	out := &k.out
	out.NewRequests, out.CachedRequests = out.NewRequests[:0], out.CachedRequests[:0]
	clear(out.NumScheduledTokens)
	// One slab for every request's new block ids (the connector copies them).
	var need int
	for _, e := range sched {
		need += len(e.s.table) - e.s.kb.told
		if e.s.kb.isNew {
			need += e.s.kb.told
		}
	}
	slab := make([]kvbm.DeviceBlockID, 0, need)
	for _, e := range sched {
		s, q := e.s, e.s.kb
		from := q.told
		if q.isNew {
			from = 0
		}
		lo := len(slab)
		for _, id := range s.table[from:] {
			slab = append(slab, kvbm.DeviceBlockID(id))
		}
		d := kvbm.TRTLLMRequestData{ID: q.id, NewBlockIDs: slab[lo:len(slab):len(slab)], ComputedPosition: s.computed,
			Len: s.total(), Local: s.local}
		if q.isNew {
			out.NewRequests = append(out.NewRequests, d)
		} else {
			out.CachedRequests = append(out.CachedRequests, d)
		}
		q.isNew, q.told = false, len(s.table)
		out.NumScheduledTokens[q.id] = e.n
	}
	if len(sched) == 0 && len(k.loading) == 0 {
		return
	}
	md, err := k.lead.BuildConnectorMeta(out)
	k.fail(err)
	if md == nil {
		return
	}
	k.fail(k.wk.BindConnectorMetadata(md))
	failed := k.wk.BlockIDsWithLoadErrors()
	for _, op := range md.Ops {
		if op.Kind != kvbm.OpLoad {
			continue
		}
		var owner *Seq
		for _, s := range k.loading {
			if s.kb.id == op.Request {
				owner = s
			}
		}
		for i, id := range op.Into {
			if !containsID(failed, id) {
				k.c.pool.storeSum(int32(id))
			} else if owner != nil && i < len(op.Load) {
				// The request computes from the first block that did not
				// load, as an engine does with the load-error block ids:
				// the connector then stores what it recomputes, so a
				// block dropped as corrupt is offloaded again.
				owner.computed -= (len(op.Load) - i) * k.c.bs
				break
			}
		}
	}
	for _, id := range failed {
		// Recompute: the block's bytes are derived again on first read.
		k.c.pool.blocks[id].flags |= flagUnfilled
	}
	k.st.LoadFailures += uint64(len(failed))
	for _, s := range k.loading {
		s.kb.ready = now
		info, ok := k.conn.Slot(s.kb.id)
		if !ok {
			continue
		}
		dh, dd, do := info.LoadedHost-s.kb.host, info.LoadedDisk-s.kb.disk, info.LoadedObject-s.kb.obj
		s.kb.host, s.kb.disk, s.kb.obj = info.LoadedHost, info.LoadedDisk, info.LoadedObject
		blocks := float64(dh+dd+do) / float64(k.c.bs)
		k.st.OnboardBytes += uint64(blocks * k.bpb)
		var ms float64
		if k.hostBW > 0 {
			ms += float64(dh) / float64(k.c.bs) * k.bpb / k.hostBW * 1e3
		}
		if k.diskBW > 0 {
			ms += float64(dd) / float64(k.c.bs) * k.bpb / k.diskBW * 1e3
		}
		if k.objBW > 0 {
			ms += float64(do) / float64(k.c.bs) * k.bpb / k.objBW * 1e3
		}
		// Loads queue on the channel behind the ones still in flight.
		start := now
		if k.loadFree.After(start) {
			start = k.loadFree
		}
		s.kb.ready = start.Add(msToDuration(ms * k.loadScale))
		k.loadFree = s.kb.ready
		if !s.kb.counted {
			s.kb.counted = true
			s.m.HostTokens, s.m.DiskTokens, s.m.ObjectTokens = dh, dd, do
			k.st.HostTokens += uint64(dh)
			k.st.DiskTokens += uint64(dd)
			k.st.ObjectTokens += uint64(do)
			// What the tiers staged but could not load was recomputed.
			lost := s.m.ExternalTokens - dh - dd - do
			s.m.CachedTokens -= lost
			k.c.counters.CachedTokens -= uint64(lost)
		}
	}
	clear(k.loading)
	k.loading = k.loading[:0]
}

// promote moves the requests whose load has landed by now to the running
// set (in load order, which is admission order).
func (k *kbCore) promote(now time.Time) {
	k.now = now
	n := 0
	for _, s := range k.loadq {
		if s.kb.ready.After(now) {
			break
		}
		s.st = stRunning
		k.c.running = append(k.c.running, s)
		n++
	}
	if n > 0 {
		clear(k.loadq[:n])
		k.loadq = append(k.loadq[:0], k.loadq[n:]...)
	}
}

// unload drops an aborted request from the onboarding queue.
func (k *kbCore) unload(s *Seq) {
	for i, x := range k.loadq {
		if x == s {
			k.loadq = append(k.loadq[:i], k.loadq[i+1:]...)
			return
		}
	}
}

func containsID(ids []kvbm.DeviceBlockID, id kvbm.DeviceBlockID) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// saved runs the pass's stores once its forward pass is done.
func (k *kbCore) saved() {
	k.wk.WaitForSave()
	_, _, err := k.wk.GetFinished()
	k.fail(err)
}

// finished reports s done to the connector.
func (k *kbCore) finished(s *Seq) {
	if s.kb == nil {
		return
	}
	// Stores run within the pass, so none is in flight here and the
	// blocks may be freed at once.
	k.lead.RequestFinished(s.kb.id, nil)
}

// simDevice is the sim's pool as kvbm's Device (and Checksummer): a block's
// payload, every layer concatenated.
type simDevice struct{ c *Core }

func (d simDevice) block(id kvbm.DeviceBlockID) (int32, error) {
	if id < 0 || int(id) >= len(d.c.pool.blocks) {
		return 0, fmt.Errorf("sim: device block %d out of range [0, %d)", id, len(d.c.pool.blocks))
	}
	return int32(id), nil
}

// ReadView is a computed block's bytes (derived on first read).
func (d simDevice) ReadView(id kvbm.DeviceBlockID) ([]byte, error) {
	b, err := d.block(id)
	if err != nil {
		return nil, err
	}
	d.c.pool.fill(b)
	return d.c.pool.blockPayload(b), nil
}

// WriteView is the block's bytes for a load to write: they are no longer
// derived on first read.
func (d simDevice) WriteView(id kvbm.DeviceBlockID) ([]byte, error) {
	b, err := d.block(id)
	if err != nil {
		return nil, err
	}
	d.c.pool.blocks[b].flags &^= flagUnfilled
	return d.c.pool.blockPayload(b), nil
}

// BlockChecksum is the checksum the pool keeps (Config.StoreChecksums).
func (d simDevice) BlockChecksum(id kvbm.DeviceBlockID) (uint64, bool) {
	b, err := d.block(id)
	if err != nil || d.c.pool.sums == nil {
		return 0, false
	}
	d.c.pool.fill(b)
	return d.c.pool.sums[b], true
}

// RecomputeAuto as KVBMConfig.RecomputePerToken weighs tier loads against
// the timing model's prefill cost per token.
const RecomputeAuto time.Duration = -1

// RecomputeCost is a timing model's prefill cost per token: the mean
// marginal cost of a token in a full chunk of chunk tokens (the pass's
// fixed cost left out, as recomputed tokens join a pass that runs anyway).
func RecomputeCost(tm TimingModel, chunk int) time.Duration {
	if tm == nil {
		tm = Polynomial{}
	}
	if chunk < 2 {
		return msToDuration(tm.PrefillMS(1))
	}
	return msToDuration((tm.PrefillMS(chunk) - tm.PrefillMS(1)) / float64(chunk-1))
}

// objectDrain is how long closing a core waits for its queued object
// writes before it cancels them (they cost a recompute, not correctness).
const objectDrain = 2 * time.Second

// TierReady is signalled when an asynchronous object write completes
// (nil without one): the engine then calls SettleTiers, so the block is
// announced even while no request runs.
func (c *Core) TierReady() <-chan struct{} {
	if c.kb == nil || c.kb.async == nil {
		return nil
	}
	return c.kb.async.Ready()
}

// SettleTiers registers the object writes completed since the last call
// and delivers their events.
func (c *Core) SettleTiers() {
	if c.kb == nil || c.kb.async == nil {
		return
	}
	c.kb.mgr.Settle()
	c.ev.flush()
}

// KVBMStats returns the block manager's totals (zero without one).
func (c *Core) KVBMStats() KVBMStats {
	if c.kb == nil {
		return KVBMStats{}
	}
	st := c.kb.st
	st.Stats = c.kb.mgr.Stats()
	return st
}

// KVBMErr is the last connector error, if any (for tests and logs).
func (c *Core) KVBMErr() error {
	if c.kb == nil {
		return nil
	}
	return c.kb.lastErr
}

// HoldsTier reports which of the block manager's tiers hold seq.
func (c *Core) HoldsTier(seq kv.SeqHash) (host, disk bool) {
	if c.kb == nil {
		return false, false
	}
	return c.kb.mgr.Holds(seq)
}

// Close releases what the core holds outside memory: the disk tier's file
// is synced and closed, so every stored block is recoverable.
func (c *Core) Close() error {
	if c.kb == nil {
		return nil
	}
	return c.kb.close()
}

// KVBMStats sums the block managers' totals over the ranks.
func (e *Engine) KVBMStats() KVBMStats {
	var t KVBMStats
	for _, r := range e.ranks() {
		r.mu.Lock()
		s := r.core.KVBMStats()
		r.mu.Unlock()
		t.add(s)
	}
	return t
}

func (t *KVBMStats) add(s KVBMStats) {
	a, b := &t.Stats, s.Stats
	a.HostBlocks += b.HostBlocks
	a.DiskBlocks += b.DiskBlocks
	a.OffloadedHost += b.OffloadedHost
	a.OffloadedDisk += b.OffloadedDisk
	a.ObjectBlocks += b.ObjectBlocks
	a.OffloadedObject += b.OffloadedObject
	a.EvictedObject += b.EvictedObject
	a.MatchedObject += b.MatchedObject
	a.OnboardedObject += b.OnboardedObject
	a.RecoveredObject += b.RecoveredObject
	a.PendingObject += b.PendingObject
	a.DroppedObject += b.DroppedObject
	a.FailedObject += b.FailedObject
	a.DeclinedLoad += b.DeclinedLoad
	a.DedupHost += b.DedupHost
	a.DedupDisk += b.DedupDisk
	a.FilteredDisk += b.FilteredDisk
	a.FullHost += b.FullHost
	a.FullDisk += b.FullDisk
	a.EvictedHost += b.EvictedHost
	a.EvictedDisk += b.EvictedDisk
	a.MatchedHost += b.MatchedHost
	a.MatchedDisk += b.MatchedDisk
	a.OnboardedHost += b.OnboardedHost
	a.OnboardedDisk += b.OnboardedDisk
	a.Corrupt += b.Corrupt
	a.RecoveredDisk += b.RecoveredDisk
	a.Errors += b.Errors
	t.HostTokens += s.HostTokens
	t.DiskTokens += s.DiskTokens
	t.ObjectTokens += s.ObjectTokens
	t.OnboardBytes += s.OnboardBytes
	t.LoadFailures += s.LoadFailures
	t.RecoveredCorrupt += s.RecoveredCorrupt
	t.ConnectorErrors += s.ConnectorErrors
}

var _ engine.Inventory = (*Engine)(nil)

// pinTiers extends a pin of seqs' first n blocks on the device with the
// host tier's blocks from there on, so a peer is served from G2 what the
// device no longer holds.
func (c *Core) pinTiers(seqs []kv.SeqHash, n int, release func()) (int, func()) {
	if c.kb == nil || n == len(seqs) {
		return n, release
	}
	staged := c.kb.mgr.PinHost(nil, seqs[n:])
	if len(staged) == 0 {
		return n, release
	}
	released := false
	return n + len(staged), func() {
		if released {
			return
		}
		released = true
		release()
		c.kb.mgr.Release(staged)
	}
}

// hostView is a host-tier block's pinned bytes and checksum, if the host
// tier holds seq under a pin.
func (c *Core) hostView(seq kv.SeqHash) ([]byte, uint64, bool) {
	if c.kb == nil {
		return nil, 0, false
	}
	v, sum, err := c.kb.mgr.HostView(seq)
	return v, sum, err == nil
}

// TierLoadMS is the modelled time to onboard one block from each tier
// (host, disk, object; the device entry is 0), for the router's time cost.
// Without a block manager it is all zeros (unknown). A free tier (bandwidth
// < 0) reports a nominal nanosecond, since 0 would read as unknown.
func (c *Core) TierLoadMS() [kv.NumTiers]float64 {
	if c.kb == nil {
		return [kv.NumTiers]float64{}
	}
	return tierLoadMS(c.kb.bpb, c.kb.hostBW, c.kb.diskBW, c.kb.objBW)
}

// KVBMTierLoadMS is TierLoadMS for a core built from cfg, without building
// it: what `serve` tells its router about its simulated workers.
func KVBMTierLoadMS(cfg Config) [kv.NumTiers]float64 {
	if cfg.KVBM == nil {
		return [kv.NumTiers]float64{}
	}
	bpb := cfg.TransferBytesPerBlock
	if bpb == 0 {
		bpb = int64(cfg.Layers * cfg.PayloadSize)
	}
	k := cfg.KVBM
	or := func(bw, def float64) float64 {
		if bw == 0 {
			return def
		}
		return bw
	}
	return tierLoadMS(float64(bpb), or(k.HostBandwidth, DefaultHostBandwidth), or(k.DiskBandwidth, DefaultDiskBandwidth),
		or(k.ObjectBandwidth, DefaultObjectBandwidth))
}

func tierLoadMS(bpb, host, disk, obj float64) [kv.NumTiers]float64 {
	var out [kv.NumTiers]float64
	for t, bw := range [kv.NumTiers]float64{kv.TierHost: host, kv.TierDisk: disk, kv.TierExternal: obj} {
		if t == int(kv.TierDevice) {
			continue
		}
		out[t] = 1e-6
		if bw > 0 {
			out[t] = bpb / bw * 1e3
		}
	}
	return out
}

// OnboardBacklog is how long the onboarding channel stays busy with the
// loads already queued, from now, in modelled time (0 without a block
// manager or when the channel is idle).
func (c *Core) OnboardBacklog(now time.Time) time.Duration {
	if c.kb == nil || !c.kb.loadFree.After(now) {
		return 0
	}
	d := c.kb.loadFree.Sub(now)
	if c.kb.loadScale > 0 {
		d = time.Duration(float64(d) / c.kb.loadScale)
	}
	return d
}
