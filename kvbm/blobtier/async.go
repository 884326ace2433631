package blobtier

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/kvbm"
)

// AsyncConfig shapes an Async writer.
type AsyncConfig struct {
	// Depth is the staging buffers: the writes queued or running at once.
	// The queue holds Depth × block bytes of memory, allocated up front.
	Depth int
	// Writers is the goroutines putting objects (0: min(Depth, 4)).
	Writers int
	// Drain is how long Close waits for queued writes to finish before it
	// cancels the rest (0: cancel at once).
	Drain time.Duration
}

// Async is a Store whose block writes run on its own goroutines behind a
// bounded queue (kvbm.AsyncPutter), so that a slow bucket never stalls the
// offload that evicted the block: PutAsync copies the block into one of
// Depth staging buffers and returns; a full queue refuses the write (the
// manager counts it dropped). Each write checks the staged bytes against
// the block's checksum and sends the object's MD5 with it; the manager
// registers the block only after Completed reports it.
//
// Writes are routed to writers by key, so all operations on one object
// (a put, the delete that frees its slot for another block, a put again)
// run in the order they were queued. Get, Scan and Put (the synchronous
// path) stay on the manager's goroutine, as with a plain Store; a slot is
// never read while its write is in flight (the manager keeps it pinned).
type Async struct {
	*Store
	ctx    context.Context
	cancel context.CancelFunc
	drain  time.Duration

	free   chan []byte   // staging buffers not in use
	dels   chan struct{} // delete tokens: at most Depth deletes queued
	shards []chan asyncJob
	wg     sync.WaitGroup
	closed bool

	mu    sync.Mutex
	done  []kvbm.PutResult
	ready chan struct{}
}

type asyncJob struct {
	slot int
	del  bool
	key  kv.SeqHash // del: the object to delete
	buf  []byte
	meta kvbm.BlockMeta
}

// NewAsync starts cfg.Writers goroutines writing s's blocks; Close stops
// them (and closes s).
func NewAsync(s *Store, cfg AsyncConfig) (*Async, error) {
	if cfg.Depth <= 0 || cfg.Writers < 0 || cfg.Drain < 0 {
		return nil, fmt.Errorf("kvbm object tier: async queue of %d blocks, %d writers, drain %v", cfg.Depth, cfg.Writers, cfg.Drain)
	}
	w := cfg.Writers
	if w == 0 {
		w = min(cfg.Depth, 4)
	}
	a := &Async{Store: s, drain: cfg.Drain, free: make(chan []byte, cfg.Depth), dels: make(chan struct{}, cfg.Depth),
		shards: make([]chan asyncJob, w), ready: make(chan struct{}, 1)}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	slab := make([]byte, cfg.Depth*s.bb)
	for i := range cfg.Depth {
		a.free <- slab[i*s.bb : (i+1)*s.bb : (i+1)*s.bb]
		a.dels <- struct{}{}
	}
	a.wg.Add(w)
	for i := range a.shards {
		// Every put holds a buffer and every delete a token: the
		// channel never fills, so PutAsync never blocks.
		a.shards[i] = make(chan asyncJob, 2*cfg.Depth)
		go a.writer(a.shards[i])
	}
	return a, nil
}

// Ready is signalled (capacity one, never closed) when a write completes:
// the manager's owner then calls Manager.Settle.
func (a *Async) Ready() <-chan struct{} { return a.ready }

// Full implements kvbm.AsyncPutter.
func (a *Async) Full() bool {
	return a.closed || len(a.free) == 0 || len(a.dels) == 0
}

// PutAsync implements kvbm.AsyncPutter. The object the slot held before,
// if another, is deleted first (in order with any later write of it).
func (a *Async) PutAsync(slot int, src []byte, m kvbm.BlockMeta) bool {
	if a.Full() || a.check(slot, len(src)) != nil {
		return false
	}
	buf := <-a.free
	if a.has[slot] && a.keys[slot] != m.Seq {
		<-a.dels
		old := a.keys[slot]
		a.shard(old) <- asyncJob{slot: slot, del: true, key: old}
	}
	copy(buf, src)
	// The slot may hold this object from now on (a failed put may leave
	// it behind): the next block given the slot deletes it.
	a.keys[slot], a.has[slot] = m.Seq, true
	a.shard(m.Seq) <- asyncJob{slot: slot, buf: buf, meta: m}
	return true
}

func (a *Async) shard(h kv.SeqHash) chan asyncJob {
	return a.shards[uint64(h)%uint64(len(a.shards))]
}

// Completed implements kvbm.AsyncPutter.
func (a *Async) Completed(dst []kvbm.PutResult) []kvbm.PutResult {
	a.mu.Lock()
	dst = append(dst, a.done...)
	clear(a.done)
	a.done = a.done[:0]
	a.mu.Unlock()
	return dst
}

func (a *Async) writer(jobs <-chan asyncJob) {
	defer a.wg.Done()
	hdr := make([]byte, kvbm.BlockHeaderSize)
	for j := range jobs {
		if j.del {
			if a.ctx.Err() == nil {
				// A failed delete leaves an orphan object that the
				// next start's Scan drops or recovers (it is a whole,
				// self-checking block).
				ctx, cancel := a.call()
				_ = a.b.Delete(ctx, a.Key(j.key))
				cancel()
			}
			a.dels <- struct{}{}
			continue
		}
		err := a.ctx.Err()
		if err == nil {
			if got := kv.Checksum(j.buf); got != j.meta.Sum {
				err = &kvbm.CorruptError{Tier: kv.TierExternal, Seq: j.meta.Seq, Got: got, Want: j.meta.Sum}
			} else {
				ctx, cancel := a.call()
				err = a.write(ctx, hdr, j.buf, j.meta, true)
				cancel()
			}
		}
		a.free <- j.buf
		a.mu.Lock()
		a.done = append(a.done, kvbm.PutResult{Slot: j.slot, Meta: j.meta, Err: err})
		a.mu.Unlock()
		select {
		case a.ready <- struct{}{}:
		default:
		}
	}
}

// call is one bucket call's context: cancelled by Close, and bounded by
// the Store's per-call timeout on remote buckets.
func (a *Async) call() (context.Context, context.CancelFunc) {
	if a.timeout == 0 {
		return a.ctx, func() {}
	}
	return context.WithTimeout(a.ctx, a.timeout)
}

// Close stops taking writes, waits up to the drain time for the queued
// ones, cancels what is left, waits for the writers to exit and closes the
// Store. Call it from the manager's goroutine, after its last call.
func (a *Async) Close() error {
	if a.closed {
		return nil
	}
	a.closed = true
	for _, ch := range a.shards {
		close(ch)
	}
	idle := make(chan struct{})
	go func() {
		a.wg.Wait()
		close(idle)
	}()
	var err error
	switch {
	case a.drain > 0:
		t := time.NewTimer(a.drain)
		select {
		case <-idle:
		case <-t.C:
		}
		t.Stop()
	case len(a.free) == cap(a.free) && len(a.dels) == cap(a.dels):
		// Nothing queued: the writers are exiting.
		<-idle
	}
	select {
	case <-idle:
	default:
		a.cancel()
		<-idle
		err = errors.New("kvbm object tier: close cancelled writes still queued")
	}
	a.cancel()
	return errors.Join(err, a.Store.Close())
}
