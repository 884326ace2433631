package eventplane

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
)

// ActionKind says what a FeedCore asks its driver to do.
type ActionKind uint8

const (
	// ActApply: apply Events, in order, to the index; Worker's last
	// applied id is then Last (Events may be empty: a dump of nothing).
	ActApply ActionKind = iota + 1
	// ActRemoveWorker: drop Worker's holdings from the index (the instance
	// left, or a dump is about to replace them).
	ActRemoveWorker
	// ActFetch: start Fetch and hand its answer back to FeedCore.Answer.
	// Worker is not caught up until then.
	ActFetch
	// ActBad: a message or event was skipped (counted in BadMessages);
	// Where and Err say why.
	ActBad
)

func (k ActionKind) String() string {
	switch k {
	case ActApply:
		return "apply"
	case ActRemoveWorker:
		return "remove"
	case ActFetch:
		return "fetch"
	case ActBad:
		return "bad"
	}
	return fmt.Sprintf("action(%d)", uint8(k))
}

// Action is one thing the driver must do, in the order given.
type Action struct {
	Kind   ActionKind
	Worker kv.WorkerKey
	Events []kv.Event // ActApply
	Last   uint64     // ActApply
	Fetch  *Fetch     // ActFetch
	Where  string     // ActBad: the subject
	Err    error      // ActBad
}

// Fetch is a repair to run against a worker: a Dump of the key's
// holdings, or the events From..To of its ring.
type Fetch struct {
	Instance discovery.Instance // whom to ask
	Worker   kv.WorkerKey
	// Ticket identifies this fetch; the answer carries it back, and an
	// answer whose ticket the core no longer waits for is stale.
	Ticket   uint64
	Dump     bool
	From, To uint64 // range fetches only
	// Delay is the backoff to wait before asking.
	Delay time.Duration
	// Retry is the failure this fetch retries (nil for a first attempt).
	Retry error
}

// Answer is what a Fetch brought back.
type Answer struct {
	Worker kv.WorkerKey
	Ticket uint64
	// Events are the range's events or the dump's Stored events; the core
	// stamps them with Worker and keeps them.
	Events []kv.Event
	Last   uint64 // dumps: the last event id the holdings reflect
	TooOld bool   // ranges: the worker's ring no longer has From
	Err    error
}

// Default queue bound and repair backoff of a FeedCore.
const (
	DefaultMaxQueue = 65536
	minBackoff      = 100 * time.Millisecond
	maxBackoff      = 5 * time.Second
)

// FeedCore is the event feed's ordering and gap logic: a caller-driven
// state machine with no goroutines, no I/O and no clock. Discovery changes,
// event messages, load reports and repair answers go in; each call returns
// the actions to carry out, in order, valid until the next call.
//
// Per worker key it applies events in id order and skips duplicates. A
// gap (an id past last+1, or a last id announced by two load reports in a
// row that the key still has not reached) starts a range repair; events
// arriving meanwhile queue behind it. A range the worker's ring no longer
// holds, a failed repair with nothing queued, or a queue past MaxQueue
// turns into a dump, which replaces the key's holdings; so does a range
// the worker answers short (its ids end inside the gap: the ids past it
// were never its own), dropping what queued past the gap. A new instance is
// dumped; a removed or re-shaped one is dropped at once. Failed repairs are
// retried with exponential backoff.
//
// Not safe for concurrent use.
type FeedCore struct {
	maxQueue int
	insts    map[uint64]*coreInstance
	ticket   uint64
	st       FeedStats
	out      []Action
}

type coreInstance struct {
	info discovery.Instance
	keys []*coreKey
}

type coreKey struct {
	w    kv.WorkerKey
	last uint64
	// pending is the ticket of the fetch in flight (0: none); while it is
	// set, events queue.
	pending  uint64
	dump     bool   // the fetch in flight is a dump
	to       uint64 // the range fetch in flight ends here
	needDump bool
	queue    []kv.Event
	backoff  time.Duration
	// announced is the highest last id the worker's load reports named.
	announced uint64
}

// NewFeedCore returns a core that holds at most maxQueue events per key
// while a repair is in flight (≤ 0: DefaultMaxQueue).
func NewFeedCore(maxQueue int) *FeedCore {
	if maxQueue <= 0 {
		maxQueue = DefaultMaxQueue
	}
	return &FeedCore{maxQueue: maxQueue, insts: map[uint64]*coreInstance{}}
}

// Stats returns the counters.
func (c *FeedCore) Stats() FeedStats { return c.st }

// LastID is the last event id applied for w, and whether w is known and
// not being repaired.
func (c *FeedCore) LastID(w kv.WorkerKey) (uint64, bool) {
	k := c.key(w)
	if k == nil || k.pending != 0 {
		return 0, false
	}
	return k.last, true
}

func (c *FeedCore) key(w kv.WorkerKey) *coreKey {
	fi := c.insts[w.Instance]
	if fi == nil || int(w.DPRank) >= len(fi.keys) {
		return nil
	}
	return fi.keys[w.DPRank]
}

func (c *FeedCore) begin() {
	clear(c.out)
	c.out = c.out[:0]
}

// Discovery takes a change from the discovery watcher.
func (c *FeedCore) Discovery(ev discovery.Event) []Action {
	c.begin()
	in := ev.Instance
	cur := c.insts[in.ID]
	switch ev.Kind {
	case discovery.InstanceAdded, discovery.InstanceUpdated:
		if cur != nil && cur.info.DPSize == in.DPSize && cur.info.Incarnation == in.Incarnation {
			cur.info = in // address or metadata change: same holdings
			return c.out
		}
		if cur != nil {
			c.drop(cur)
		}
		fi := &coreInstance{info: in}
		for _, w := range in.Workers() {
			fi.keys = append(fi.keys, &coreKey{w: w, needDump: true})
		}
		c.insts[in.ID] = fi
		c.st.InstancesAdded++
		for _, k := range fi.keys {
			c.startRepair(fi, k, nil)
		}
	case discovery.InstanceRemoved:
		if cur != nil {
			c.drop(cur)
			c.st.InstancesRemoved++
		}
	}
	return c.out
}

func (c *FeedCore) drop(fi *coreInstance) {
	delete(c.insts, fi.info.ID)
	for _, k := range fi.keys {
		c.out = append(c.out, Action{Kind: ActRemoveWorker, Worker: k.w})
	}
}

// Message takes one message from an instance's event subject: an
// api.KvEventBatch.
func (c *FeedCore) Message(subject string, data []byte) []Action {
	c.begin()
	id, err := natsbus.ParseInstanceToken(subject)
	if err != nil {
		c.bad("subject", err)
		return c.out
	}
	fi := c.insts[id]
	if fi == nil {
		// Not discovered yet (its dump will cover this) or already gone.
		c.st.UnknownInstance++
		return c.out
	}
	var batch api.KvEventBatch
	if err := proto.Unmarshal(data, &batch); err != nil {
		c.bad(subject, err)
		return c.out
	}
	if batch.Instance != id {
		c.bad(subject, fmt.Errorf("batch of instance %x on its subject", batch.Instance))
		return c.out
	}
	c.st.Batches++
	for _, p := range batch.Events {
		e, err := api.EventFromProto(p)
		c.take(fi, id, subject, e, err)
	}
	return c.out
}

// Batch takes a batch of instance id's events that a worker of this
// process handed over directly (Local): already decoded, checked as a
// message's events are.
func (c *FeedCore) Batch(id uint64, evs []kv.Event) []Action {
	c.begin()
	fi := c.insts[id]
	if fi == nil {
		c.st.UnknownInstance++
		return c.out
	}
	c.st.Batches++
	for _, e := range evs {
		c.take(fi, id, "in process", e, checkLocal(&e))
	}
	return c.out
}

// LocalCopy counts a NATS message skipped because its worker's batches
// come in process (FeedStats.LocalCopies).
func (c *FeedCore) LocalCopy() []Action {
	c.begin()
	c.st.LocalCopies++
	return c.out
}

// checkLocal is what EventFromProto checks of an event that came in
// process without a conversion.
func checkLocal(e *kv.Event) error {
	switch {
	case e.Tier >= kv.NumTiers:
		return fmt.Errorf("kv event %d: unknown tier %d", e.ID, e.Tier)
	case e.Kind == kv.EventStored && len(e.Blocks) == 0:
		return fmt.Errorf("kv event %d: stored event without blocks", e.ID)
	case e.Kind != kv.EventStored && e.Kind != kv.EventRemoved && e.Kind != kv.EventCleared:
		return fmt.Errorf("kv event %d: unknown kind %v", e.ID, e.Kind)
	}
	return nil
}

// take offers one event of instance id (err: it did not decode).
func (c *FeedCore) take(fi *coreInstance, id uint64, where string, e kv.Event, err error) {
	if err == nil && (e.Worker.Instance != id || int(e.Worker.DPRank) >= len(fi.keys)) {
		err = fmt.Errorf("event for worker %v from instance %x (dp_size %d)", e.Worker, id, len(fi.keys))
	}
	if err == nil && e.ID == 0 {
		err = errors.New("event without id")
	}
	if err != nil {
		c.bad(where, err)
		return
	}
	c.offer(fi, fi.keys[e.Worker.DPRank], e)
}

func (c *FeedCore) bad(where string, err error) {
	c.st.BadMessages++
	c.out = append(c.out, Action{Kind: ActBad, Where: where, Err: err})
}

// Load takes a load report. Events lost at the end of a stream (a NATS
// outage, a slow consumer) leave no gap until the worker's next event,
// which may never come; the last ids a report announces reveal them. The
// core repairs a key still behind the id announced one report earlier
// (the events of the newest report may be in flight on the other
// subscription). Unknown instances and ranks are ignored.
func (c *FeedCore) Load(r LoadReport) []Action {
	c.begin()
	for w, id := range r.LastEvents() {
		c.announce(w, id)
	}
	return c.out
}

func (c *FeedCore) announce(w kv.WorkerKey, id uint64) {
	fi := c.insts[w.Instance]
	if fi == nil || int(w.DPRank) >= len(fi.keys) {
		return
	}
	k := fi.keys[w.DPRank]
	prev := k.announced
	k.announced = max(k.announced, id)
	if k.pending != 0 || k.last >= prev {
		return
	}
	c.st.Gaps++
	c.st.TailGaps++
	c.startRepair(fi, k, nil)
}

// offer takes one event for k: queued while repairing, applied if next,
// skipped if old, and a gap starts a range repair.
func (c *FeedCore) offer(fi *coreInstance, k *coreKey, e kv.Event) {
	if k.pending != 0 {
		if len(k.queue) >= c.maxQueue {
			c.st.QueueOverflows++
			k.queue = k.queue[:0]
			k.needDump = true
		}
		k.queue = append(k.queue, e)
		return
	}
	switch {
	case e.ID <= k.last:
		c.st.Duplicates++
	case e.ID == k.last+1:
		c.st.Applied++
		k.last = e.ID
		c.apply(k.w, k.last, e)
	default:
		c.st.Gaps++
		k.queue = append(k.queue, e)
		c.startRepair(fi, k, nil)
	}
}

// apply adds events to the previous action when it applies to the same
// key, so a batch becomes one action.
func (c *FeedCore) apply(w kv.WorkerKey, last uint64, evs ...kv.Event) {
	if n := len(c.out); n > 0 && c.out[n-1].Kind == ActApply && c.out[n-1].Worker == w {
		c.out[n-1].Events = append(c.out[n-1].Events, evs...)
		c.out[n-1].Last = last
		return
	}
	c.out = append(c.out, Action{Kind: ActApply, Worker: w, Events: evs, Last: last})
}

func (c *FeedCore) startRepair(fi *coreInstance, k *coreKey, retry error) {
	c.ticket++
	f := &Fetch{Instance: fi.info, Worker: k.w, Ticket: c.ticket, Dump: k.needDump, Delay: k.backoff, Retry: retry}
	if !f.Dump {
		f.From, f.To = k.last+1, k.announced
		if len(k.queue) > 0 {
			f.To = k.queue[0].ID - 1
		}
	}
	k.pending, k.dump, k.to = f.Ticket, f.Dump, f.To
	c.out = append(c.out, Action{Kind: ActFetch, Worker: k.w, Fetch: f})
}

// Answer takes the answer to a Fetch.
func (c *FeedCore) Answer(a Answer) []Action {
	c.begin()
	fi := c.insts[a.Worker.Instance]
	k := c.key(a.Worker)
	if k == nil || k.pending != a.Ticket {
		c.st.StaleRepairs++
		return c.out
	}
	err := a.Err
	unfillable := false
	if err == nil && !k.dump && !a.TooOld && !contiguous(a.Events, k.last+1, k.to) {
		if unfillable = shortOf(a.Events, k.last+1, k.to); !unfillable {
			err = fmt.Errorf("range answer [%d,%d] not contiguous (%d events)", k.last+1, k.to, len(a.Events))
		}
	}
	switch {
	case unfillable:
		// The worker's ids end inside the gap: it never published what
		// made the gap (a forged event or announcement, or one of another
		// incarnation), so retrying the range would never end. Its
		// holdings come from a dump, and what stood past the gap goes.
		c.st.UnfillableGaps++
		k.queue, k.announced, k.needDump = nil, 0, true
		c.restart(fi, k, nil)
		return c.out
	case err != nil:
		c.st.RepairErrors++
		k.backoff = min(max(2*k.backoff, minBackoff), maxBackoff)
		c.restart(fi, k, err)
		return c.out
	case a.TooOld:
		k.needDump = true
		c.restart(fi, k, nil)
		return c.out
	}
	k.backoff = 0
	if !k.dump && k.needDump {
		// The queue overflowed while the range was in flight.
		c.startRepair(fi, k, nil)
		return c.out
	}
	for i := range a.Events {
		a.Events[i].Worker = k.w
	}
	if k.dump {
		c.st.DumpRepairs++
		k.last, k.needDump = a.Last, false
		c.out = append(c.out, Action{Kind: ActRemoveWorker, Worker: k.w},
			Action{Kind: ActApply, Worker: k.w, Events: a.Events, Last: k.last})
	} else {
		c.st.RangeRepairs++
		c.st.Applied += int64(len(a.Events))
		k.last = k.to
		c.apply(k.w, k.last, a.Events...)
	}
	k.pending = 0
	q := k.queue
	k.queue = nil
	for i, e := range q {
		c.offer(fi, k, e)
		if k.pending != 0 {
			// A new gap: the rest waits behind it.
			k.queue = append(k.queue, q[i+1:]...)
			break
		}
	}
	return c.out
}

// restart retries a repair; a key with nothing queued needs a dump.
func (c *FeedCore) restart(fi *coreInstance, k *coreKey, err error) {
	if !k.needDump && len(k.queue) == 0 {
		k.needDump = true
	}
	c.startRepair(fi, k, err)
}

// shortOf reports whether evs are from, from+1, … but end before to: the
// answer of a worker whose last id is below to.
func shortOf(evs []kv.Event, from, to uint64) bool {
	if uint64(len(evs)) >= to-from+1 {
		return false
	}
	for i, e := range evs {
		if e.ID != from+uint64(i) {
			return false
		}
	}
	return true
}

func contiguous(evs []kv.Event, from, to uint64) bool {
	if uint64(len(evs)) != to-from+1 {
		return false
	}
	for i, e := range evs {
		if e.ID != from+uint64(i) {
			return false
		}
	}
	return true
}
