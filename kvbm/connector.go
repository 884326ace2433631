package kvbm

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// OpKind says which way an op moves blocks.
type OpKind uint8

const (
	// OpLoad onboards staged tier blocks into device blocks. It is
	// immediate: the worker runs it when it binds the metadata.
	OpLoad OpKind = iota + 1
	// OpStore offloads device blocks the step's forward pass completes.
	// It is scheduled: the worker runs it only after the forward pass.
	OpStore
)

func (k OpKind) String() string {
	switch k {
	case OpLoad:
		return "load"
	case OpStore:
		return "store"
	}
	return fmt.Sprintf("op(%d)", uint8(k))
}

// Op is one transfer of one request.
type Op struct {
	ID      uint64
	Request string
	Kind    OpKind
	Store   []StoreBlock    // OpStore: device blocks and the identities they get
	Load    []Staged        // OpLoad: the pinned tier blocks ...
	Into    []DeviceBlockID // ... and the device blocks they go to
}

// NewSlot tells the worker a request's immediate ops before any arrives.
type NewSlot struct {
	Request              string
	ExpectedImmediateOps int
}

// Metadata is what the leader hands the worker for one scheduler step
// (vLLM's KVConnectorMetadata).
type Metadata struct {
	Iteration uint64
	NewSlots  []NewSlot
	Ops       []Op
}

// Connector is the slot state machine both connector shapes drive: one
// per engine (leader and worker share it in one process). It is not safe
// for concurrent use and starts no goroutines.
type Connector struct {
	m      *Manager
	bs     int
	slots  map[string]*slot
	iter   uint64
	nextOp uint64

	// Leader → next metadata.
	newSlots []NewSlot
	ops      []Op

	// Worker → engine.
	doneSending, doneRecving []string
	loadErrors               []DeviceBlockID

	// The load-or-recompute test on every match (SetLoadCost).
	cost    LoadCost
	backlog func() time.Duration
	tiers   []kv.Tier
}

// SetLoadCost makes every match load only the prefix that is cheaper to
// load than to recompute (LoadCost.LoadPrefix); backlog, if set, is how
// long the loads already queued will keep the engine's load path busy.
// The blocks left out are released and counted (Stats.DeclinedLoad). A
// zero RecomputeToken turns the test off.
func (c *Connector) SetLoadCost(cost LoadCost, backlog func() time.Duration) {
	c.cost, c.backlog = cost, backlog
}

// NewConnector returns a connector over m.
func NewConnector(m *Manager) *Connector {
	return &Connector{m: m, bs: m.BlockSize(), slots: map[string]*slot{}}
}

// Manager is the block manager under the connector.
func (c *Connector) Manager() *Manager { return c.m }

// Slot reports a request's connector state.
func (c *Connector) Slot(id string) (SlotInfo, bool) {
	s, ok := c.slots[id]
	if !ok {
		return SlotInfo{}, false
	}
	return SlotInfo{Phase: s.phase, Tokens: s.n, DeviceBlocks: append([]DeviceBlockID(nil), s.blocks...),
		Current: s.current, Evaluated: s.evaluated, Pending: s.pending,
		LoadedHost: s.loadedHost * c.bs, LoadedDisk: s.loadedDisk * c.bs, LoadedObject: s.loadedObject * c.bs}, true
}

// Slots is the number of requests the connector tracks.
func (c *Connector) Slots() int { return len(c.slots) }

// match is get_num_new_matched_tokens: stage the longest prefix beyond the
// device's numComputed tokens held in host, then disk. It returns the
// tokens staged and whether they load asynchronously (always, when > 0).
// Calling it again re-matches; calling it for a running request means the
// engine preempted it.
func (c *Connector) match(r *Request, numComputed int) (int, bool, error) {
	if r == nil || r.ID == "" {
		return 0, false, errors.New("kvbm: match: request without an id")
	}
	s := c.slots[r.ID]
	switch {
	case s == nil:
		s = newSlot(r, c.bs)
		c.slots[r.ID] = s
	case s.phase == PhasePrefilling || s.phase == PhaseDecoding || len(s.blocks) > 0:
		// A request holding device blocks (running, or onboarded and not
		// yet scheduled) was preempted: the engine freed them.
		c.preempt(s)
	case s.phase == PhaseOnboardStaged:
		c.m.Release(s.staged)
		s.staged = nil
	case s.phase == PhaseOnboarding:
		return 0, false, fmt.Errorf("kvbm: request %q: matched again while onboarding", r.ID)
	case s.phase == PhaseFinishing:
		return 0, false, fmt.Errorf("kvbm: request %q: matched after it finished", r.ID)
	}
	if s.hashed != (r.Len > 0) {
		return 0, false, fmt.Errorf("kvbm: request %q: given by tokens and by hashes", r.ID)
	}
	s.setRequest(r, c.bs)
	if s.genOnly || numComputed%c.bs != 0 || s.n-numComputed < c.bs {
		// Decode side, a device hit that is not block aligned (partial
		// reuse), or under one full block left to find.
		return 0, false, nil
	}
	skip := numComputed / c.bs
	staged := c.m.Match(nil, s.seq[skip:])
	if n := len(staged); n > 0 && (skip+n)*c.bs == s.n {
		// The match covers the whole prompt: leave the last block (disk's
		// if any, else host's) to compute, so the engine gets logits.
		c.m.Release(staged[n-1:])
		staged = staged[:n-1]
	}
	if c.cost.RecomputeToken > 0 && len(staged) > 0 {
		c.tiers = c.tiers[:0]
		for _, b := range staged {
			c.tiers = append(c.tiers, b.Tier)
		}
		var backlog time.Duration
		if c.backlog != nil {
			backlog = c.backlog()
		}
		if k := c.cost.LoadPrefix(c.tiers, c.bs, backlog); k < len(staged) {
			c.m.decline(staged[k:])
			staged = staged[:k]
		}
	}
	if len(staged) == 0 {
		return 0, false, nil
	}
	s.staged, s.matchFrom, s.phase = staged, skip, PhaseOnboardStaged
	return len(staged) * c.bs, true, nil
}

// preempt resets a running slot: the engine freed its device blocks and
// will match and allocate again. Evaluated blocks stay evaluated (they
// are offloaded already), so nothing is offloaded twice.
func (c *Connector) preempt(s *slot) {
	s.blocks = s.blocks[:0]
	s.current = 0
	s.phase = PhasePreempted
}

// afterAlloc is update_state_after_alloc: blockIDs are the device blocks
// the engine just gave the request (its device hits and the blocks for
// the staged tokens first); deviceComputed is the tokens already on the
// device before them. With numExternal > 0 the staged blocks are mapped
// onto the device blocks right after the computed ones and a load op is
// issued.
func (c *Connector) afterAlloc(id string, blockIDs []DeviceBlockID, numExternal, deviceComputed int) error {
	s := c.slots[id]
	if s == nil {
		return fmt.Errorf("kvbm: request %q: allocation for a request never matched", id)
	}
	base := len(s.blocks)
	s.blocks = append(s.blocks, blockIDs...)
	if numExternal == 0 {
		if s.phase == PhaseOnboardStaged {
			// The engine took none of the match.
			c.m.Release(s.staged)
			s.staged, s.phase = nil, PhaseNew
		}
		return nil
	}
	if s.phase != PhaseOnboardStaged {
		return fmt.Errorf("kvbm: request %q: %d external tokens but nothing is staged (%v)", id, numExternal, s.phase)
	}
	staged := s.staged
	s.staged = nil
	fail := func(err error) error {
		c.m.Release(staged)
		s.phase = PhaseNew
		return err
	}
	if numExternal != len(staged)*c.bs {
		return fail(fmt.Errorf("kvbm: request %q: %d external tokens, %d were matched", id, numExternal, len(staged)*c.bs))
	}
	if deviceComputed != s.matchFrom*c.bs {
		return fail(fmt.Errorf("kvbm: request %q: %d tokens on the device at allocation, %d at the match", id, deviceComputed, s.matchFrom*c.bs))
	}
	first := base + s.matchFrom
	if first+len(staged) > len(s.blocks) {
		return fail(fmt.Errorf("kvbm: request %q: %d device blocks for %d computed + %d external tokens",
			id, len(blockIDs), deviceComputed, numExternal))
	}
	s.current = max(s.current, deviceComputed)
	s.loadFrom = deviceComputed
	into := append([]DeviceBlockID(nil), s.blocks[first:first+len(staged)]...)
	c.issue(s, Op{Kind: OpLoad, Load: staged, Into: into})
	c.newSlots = append(c.newSlots, NewSlot{Request: id, ExpectedImmediateOps: 1})
	s.phase = PhaseOnboarding
	return nil
}

func (c *Connector) issue(s *slot, op Op) {
	c.nextOp++
	op.ID, op.Request = c.nextOp, s.id
	s.pending++
	c.ops = append(c.ops, op)
}

// sched is one request's part of a scheduler step, in either shape.
type sched struct {
	id          string
	isNew       bool     // first time scheduled: tokens and blocks are complete lists
	req         *Request // isNew: the request, for one the connector has not seen
	resumed     bool     // cached, back from preemption: blocks are a complete list
	tokens      []kv.Token
	hlen        int            // > 0: a hashed request's tokens known (tokens unused) ...
	local       []kv.LocalHash // ... and the local hashes of their full blocks
	blocks      []DeviceBlockID
	numComputed int
}

// build applies one scheduler step and drains the pending ops into its
// metadata. A scheduled request missing from numScheduled is an error that
// names it; nothing is applied then.
func (c *Connector) build(steps []sched, numScheduled map[string]int) (*Metadata, error) {
	for _, st := range steps {
		n, ok := numScheduled[st.id]
		if !ok {
			return nil, fmt.Errorf("kvbm: request %q is scheduled but missing from num_scheduled_tokens", st.id)
		}
		if n < 0 {
			return nil, fmt.Errorf("kvbm: request %q: num_scheduled_tokens %d", st.id, n)
		}
		if c.slots[st.id] == nil && (!st.isNew || st.req == nil) {
			return nil, fmt.Errorf("kvbm: scheduled request %q is unknown to the connector", st.id)
		}
	}
	var errs []error
	for _, st := range steps {
		if err := c.apply(st, numScheduled[st.id]); err != nil {
			errs = append(errs, err)
		}
	}
	c.iter++
	md := &Metadata{Iteration: c.iter, NewSlots: c.newSlots, Ops: c.ops}
	c.newSlots, c.ops = nil, nil
	return md, errors.Join(errs...)
}

// apply is the slot's apply_scheduler_output: record tokens and blocks,
// skip what is already computed, and issue a store of the blocks this
// forward pass completes: floor((current + scheduled)/block size) minus
// the blocks already evaluated.
func (c *Connector) apply(st sched, numScheduled int) error {
	s := c.slots[st.id]
	if s == nil {
		// A new request the engine never asked to match (build checked
		// that it is new and carries its request).
		s = newSlot(st.req, c.bs)
		c.slots[st.id] = s
	}
	if s.phase == PhaseFinishing {
		return nil
	}
	if s.hashed != (st.hlen > 0) && (st.hlen > 0 || len(st.tokens) > 0) {
		return fmt.Errorf("kvbm: request %q: given by tokens and by hashes", st.id)
	}
	known := s.n
	switch {
	case s.hashed:
		s.setHashed(st.hlen, st.local)
	case st.isNew:
		s.setTokens(st.tokens, c.bs)
	default:
		s.appendTokens(st.tokens, c.bs)
	}
	if st.isNew || st.resumed {
		if len(st.blocks) > 0 {
			s.blocks = append(s.blocks[:0], st.blocks...)
		}
	} else {
		s.blocks = append(s.blocks, st.blocks...)
	}
	switch {
	case s.n > known && !st.isNew:
		s.phase = PhaseDecoding
	case s.phase != PhaseDecoding:
		s.phase = PhasePrefilling
	}
	s.current = max(s.current, st.numComputed)
	s.evaluated = max(s.evaluated, st.numComputed/c.bs)
	end := s.current + numScheduled
	if end > len(s.blocks)*c.bs {
		return fmt.Errorf("kvbm: request %q: %d computed + %d scheduled tokens need %d device blocks, the connector knows %d",
			st.id, s.current, numScheduled, (end+c.bs-1)/c.bs, len(s.blocks))
	}
	if end > s.n {
		// The engine schedules tokens it has not given us yet: offload
		// nothing beyond what is known (Dynamo does the same).
		return nil
	}
	full := end / c.bs
	if full > s.evaluated {
		blocks := make([]StoreBlock, 0, full-s.evaluated)
		for b := s.evaluated; b < full; b++ {
			blocks = append(blocks, StoreBlock{Device: s.blocks[b], Meta: s.meta(b)})
		}
		c.issue(s, Op{Kind: OpStore, Store: blocks})
		s.evaluated = full
	}
	s.current = end
	return nil
}

// finished is request_finished: true means the engine must not free the
// request's device blocks until the worker reports it finished sending.
func (c *Connector) finished(id string) bool {
	s := c.slots[id]
	if s == nil {
		return false
	}
	if s.staged != nil {
		c.m.Release(s.staged)
		s.staged = nil
	}
	if s.pending > 0 {
		s.phase = PhaseFinishing
		return true
	}
	delete(c.slots, id)
	return false
}

// opDone records a completed op; a finishing slot with nothing left in
// flight is finished sending and forgotten.
func (c *Connector) opDone(op *Op, loaded int) {
	s := c.slots[op.Request]
	if s == nil {
		return
	}
	s.pending--
	if op.Kind == OpLoad {
		for _, b := range op.Load[:loaded] {
			switch b.Tier {
			case kv.TierHost:
				s.loadedHost++
			case kv.TierDisk:
				s.loadedDisk++
			default:
				s.loadedObject++
			}
		}
		c.loadErrors = append(c.loadErrors, op.Into[loaded:]...)
		// What the load put on the device counts as computed and is not
		// offloaded again.
		done := s.loadFrom + loaded*c.bs
		s.current = max(s.current, done)
		s.evaluated = max(s.evaluated, done/c.bs)
		if s.phase == PhaseOnboarding {
			s.phase = PhaseNew
		}
		if s.phase != PhaseFinishing {
			c.doneRecving = append(c.doneRecving, s.id)
		}
	}
	if s.phase == PhaseFinishing && s.pending == 0 {
		delete(c.slots, s.id)
		c.doneSending = append(c.doneSending, s.id)
	}
}
