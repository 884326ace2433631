package twin

import (
	"runtime"
	"sync"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/kv"
)

// indexFeed applies the cores' KV events to the index on a goroutine of its
// own, so the index learns one flush while the simulated engines run the
// next passes: applying events is most of what the index costs a replay.
// Every read of the index (the router's finds and hint planning's engine
// hashes, through syncedIndex) first waits until every event flushed
// before it is applied, so each routing decision sees exactly the index a
// one-goroutine replay gives it and every output stays the same.
//
// Two chunks take turns: the cores' sinks copy their flushes into fill
// (a core reuses its batch once the sink returns) while the applier
// applies the other. A reader that finds the applier idle applies what is
// pending itself rather than wake it and wait.
type indexFeed struct {
	ix *index.Index

	mu       sync.Mutex
	work     sync.Cond   // the applier waits here for a flush
	idle     sync.Cond   // a reader waits here for the applier's chunk
	fill     *eventChunk // flushed, not yet taken
	spare    *eventChunk // nil while its chunk is being applied
	busy     bool        // a chunk is being applied
	sleeping bool        // the applier waits on work
	closed   bool
	started  bool
	done     chan struct{}

	// Events applied by the applier and by readers (Result.IndexOffLoop).
	offLoop, onLoop uint64
}

// eventChunk holds copies of flushed events; their slices point into the
// chunk's own arrays, reused from one turn to the next.
type eventChunk struct {
	events  []kv.Event
	blocks  []kv.StoredBlock
	removed []kv.EngineHash
	tokens  []kv.Token
}

// asyncIndexFeed reports whether a run applies events on a goroutine of
// its own: only when there is a second core to run it on.
func asyncIndexFeed(cfg Config) bool { return !cfg.serialIndex && runtime.GOMAXPROCS(0) > 1 }

func newIndexFeed(ix *index.Index) *indexFeed {
	f := &indexFeed{ix: ix, fill: new(eventChunk), spare: new(eventChunk), done: make(chan struct{})}
	f.work.L, f.idle.L = &f.mu, &f.mu
	return f
}

// start runs the applier until close.
func (f *indexFeed) start() {
	f.started = true
	go f.run()
}

// add queues a copy of batch, in flush order after everything added before.
func (f *indexFeed) add(batch []kv.Event) {
	f.mu.Lock()
	wake := f.sleeping && !f.busy && len(f.fill.events) == 0
	f.fill.add(batch)
	if wake {
		f.work.Signal()
	}
	f.mu.Unlock()
}

func (c *eventChunk) add(batch []kv.Event) {
	for _, e := range batch {
		if e.Blocks != nil {
			n := len(c.blocks)
			c.blocks = append(c.blocks, e.Blocks...)
			e.Blocks = c.blocks[n:len(c.blocks):len(c.blocks)]
		}
		if e.Removed != nil {
			n := len(c.removed)
			c.removed = append(c.removed, e.Removed...)
			e.Removed = c.removed[n:len(c.removed):len(c.removed)]
		}
		if e.Tokens != nil {
			n := len(c.tokens)
			c.tokens = append(c.tokens, e.Tokens...)
			e.Tokens = c.tokens[n:len(c.tokens):len(c.tokens)]
		}
		c.events = append(c.events, e)
	}
}

// reset empties c for its next turn. An array that grew mid-turn left the
// earlier events on the old one, which the GC frees with them.
func (c *eventChunk) reset() {
	clear(c.events) // drop the LoRA and salt strings
	c.events, c.blocks, c.removed, c.tokens = c.events[:0], c.blocks[:0], c.removed[:0], c.tokens[:0]
}

// take swaps the pending chunk out for the spare one; the caller applies
// it and hands it back with put. Called with mu held, when not busy.
func (f *indexFeed) take() *eventChunk {
	c := f.fill
	f.fill, f.spare, f.busy = f.spare, nil, true
	return c
}

// put returns an applied chunk. Called with mu held.
func (f *indexFeed) put(c *eventChunk) {
	c.reset()
	f.spare, f.busy = c, false
}

func (f *indexFeed) run() {
	defer close(f.done)
	f.mu.Lock()
	defer f.mu.Unlock()
	for {
		for !f.closed && (f.busy || len(f.fill.events) == 0) {
			f.sleeping = true
			f.work.Wait()
			f.sleeping = false
		}
		if f.closed {
			return
		}
		f.applyPending(&f.offLoop)
		f.idle.Broadcast()
	}
}

// sync returns once every event added so far is in the index.
func (f *indexFeed) sync() {
	f.mu.Lock()
	for f.busy {
		f.idle.Wait()
	}
	if len(f.fill.events) > 0 {
		f.applyPending(&f.onLoop)
	}
	f.mu.Unlock()
}

// applyPending applies the pending chunk outside the lock and counts its
// events in n. Called with mu held, when not busy.
func (f *indexFeed) applyPending(n *uint64) {
	c := f.take()
	f.mu.Unlock()
	f.ix.ApplyBatch(c.events)
	f.mu.Lock()
	*n += uint64(len(c.events))
	f.put(c)
}

// close stops the applier and waits for it; events still pending are
// dropped (the run is over).
func (f *indexFeed) close() {
	if !f.started {
		return
	}
	f.mu.Lock()
	f.closed = true
	f.work.Signal()
	f.mu.Unlock()
	<-f.done
}

// offLoopShare is the share of the events applied so far that the applier
// applied.
func (f *indexFeed) offLoopShare() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := f.offLoop + f.onLoop; n > 0 {
		return float64(f.offLoop) / float64(n)
	}
	return 0
}

// syncedIndex is the router's view of an index fed by an indexFeed: each
// read waits for the events flushed before it.
type syncedIndex struct{ f *indexFeed }

func (s syncedIndex) FindMatches(local []kv.LocalHash, dst []index.Match) []index.Match {
	s.f.sync()
	return s.f.ix.FindMatches(local, dst)
}

func (s syncedIndex) EngineHashes(w kv.WorkerKey, local []kv.LocalHash, dst []kv.EngineHash) []kv.EngineHash {
	s.f.sync()
	return s.f.ix.EngineHashes(w, local, dst)
}
