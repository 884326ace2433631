package eventplane

import (
	"sync"

	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
)

// Local is the event plane between a process's own workers and its own
// feeds (kvmesh serve): a batch goes to the model's Feed as the kv.Events
// the worker stamped, without protobuf or a NATS round trip. When other
// processes may listen on NATS (another frontend, `events listen`), the
// workers publish there too and the feeds skip those copies. A remote
// worker's events arrive over NATS only, under its own identity, as
// before.
//
// The batches are shared, not copied: they are the worker's EventLog's,
// which nobody modifies once stamped.
type Local struct {
	// alsoNATS: processes other than this one may subscribe to the
	// workers' subjects, so batches go on NATS too.
	alsoNATS bool

	mu        sync.RWMutex
	feeds     map[string]*Feed // by model
	instances map[uint64]bool  // this process's workers
}

// NewLocal returns an in-process plane. alsoNATS says whether anyone
// outside the process can subscribe to its workers' events: false only
// when the process runs the NATS server and nobody else can authenticate
// to it (serve's own server under a fleet token drawn at random).
func NewLocal(alsoNATS bool) *Local {
	return &Local{alsoNATS: alsoNATS, feeds: map[string]*Feed{}, instances: map[uint64]bool{}}
}

// addWorker marks instance as one of this process's workers: feeds take
// its events from the plane and skip its NATS copies.
func (l *Local) addWorker(instance uint64) {
	l.mu.Lock()
	l.instances[instance] = true
	l.mu.Unlock()
}

func (l *Local) attach(model string, f *Feed) {
	l.mu.Lock()
	l.feeds[model] = f
	l.mu.Unlock()
}

func (l *Local) detach(model string, f *Feed) {
	l.mu.Lock()
	if l.feeds[model] == f {
		delete(l.feeds, model)
	}
	l.mu.Unlock()
}

// deliver hands a worker's stamped batch to its model's feed, if one
// runs; it never blocks (a dropped batch is a gap the feed repairs, from
// the next event or load report).
func (l *Local) deliver(model string, instance uint64, batch []kv.Event) {
	l.mu.RLock()
	f := l.feeds[model]
	l.mu.RUnlock()
	if f != nil {
		f.offerLocal(instance, batch)
	}
}

// owns reports whether a NATS event subject is one of this process's
// workers' (whose batches its feeds take from the plane instead).
func (l *Local) owns(subject string) bool {
	id, err := natsbus.ParseInstanceToken(subject)
	if err != nil {
		return false
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.instances[id]
}

// localBatch is a batch on its way from a worker of this process to a feed.
type localBatch struct {
	instance uint64
	events   []kv.Event
}
