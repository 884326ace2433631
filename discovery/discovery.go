package discovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvmesh/kvmesh/natsbus"
)

// DefaultBucket is the discovery KV bucket.
const DefaultBucket = natsbus.DiscoveryBucket

// Config configures the discovery bucket.
type Config struct {
	// Bucket is the JetStream KV bucket; default DefaultBucket.
	Bucket string
	// TTL is how long a record lives without a refresh; default and maximum
	// 10s, minimum 1s. It is a property of the bucket: the first process to
	// create the bucket sets it, later ones adopt it.
	TTL time.Duration
	// Memory keeps the bucket in memory instead of on disk.
	Memory bool
	// Key signs the records this process registers and is required of the
	// records it watches (fleetkey.Derive(token, fleetkey.Discovery)); nil:
	// records are neither signed nor checked (a fleet without a token).
	Key    []byte
	Logger *slog.Logger
}

// MaxTTL bounds how long a dead worker stays routable.
const MaxTTL = 10 * time.Second

// Discovery is the worker registry: a JetStream KV bucket whose keys are
// "<model token>.<instance hex>" and whose values are Instance JSON.
//
// Records expire with the bucket's MaxAge. The bucket is created with
// limit markers (nats-server ≥ 2.11), so an expiry leaves a marker that
// watchers see as a removal, exactly like a delete.
type Discovery struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	cfg Config
	log *slog.Logger

	mu  sync.Mutex
	kv  jetstream.KeyValue
	ttl time.Duration
}

// Open binds to (creating if needed) the discovery bucket.
func Open(ctx context.Context, nc *nats.Conn, cfg Config) (*Discovery, error) {
	if cfg.Bucket == "" {
		cfg.Bucket = DefaultBucket
	}
	if cfg.TTL == 0 {
		cfg.TTL = MaxTTL
	}
	if cfg.TTL < time.Second || cfg.TTL > MaxTTL {
		return nil, fmt.Errorf("discovery: TTL %v outside 1s..%v", cfg.TTL, MaxTTL)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("discovery: jetstream: %w", err)
	}
	d := &Discovery{nc: nc, js: js, cfg: cfg, log: cfg.Logger}
	if _, err := d.bucket(ctx, true); err != nil {
		return nil, err
	}
	return d, nil
}

// TTL is the bucket's record lifetime.
func (d *Discovery) TTL() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ttl
}

// bucket returns the bound bucket, (re)binding or creating it when asked:
// after a NATS restart with a fresh data dir the bucket is gone and the
// first refresher recreates it.
func (d *Discovery) bucket(ctx context.Context, rebind bool) (jetstream.KeyValue, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.kv != nil && !rebind {
		return d.kv, nil
	}
	storage := jetstream.FileStorage
	if d.cfg.Memory {
		storage = jetstream.MemoryStorage
	}
	kvb, err := d.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:         d.cfg.Bucket,
		Description:    "kvmesh worker discovery",
		History:        1,
		TTL:            d.cfg.TTL,
		LimitMarkerTTL: d.cfg.TTL,
		Storage:        storage,
	})
	if errors.Is(err, jetstream.ErrBucketExists) {
		kvb, err = d.js.KeyValue(ctx, d.cfg.Bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("discovery: bucket %s: %w", d.cfg.Bucket, err)
	}
	st, err := kvb.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("discovery: bucket %s status: %w", d.cfg.Bucket, err)
	}
	if st.TTL() <= 0 || st.LimitMarkerTTL() <= 0 {
		// A bucket someone made without TTL or markers would keep dead
		// workers forever or hide expiries from watchers.
		return nil, fmt.Errorf("discovery: bucket %s has TTL %v and limit-marker TTL %v; both must be set (delete the bucket to let kvmesh recreate it)", d.cfg.Bucket, st.TTL(), st.LimitMarkerTTL())
	}
	d.kv, d.ttl = kvb, st.TTL()
	return kvb, nil
}

// Registration keeps one instance record alive until Close.
type Registration struct {
	d      *Discovery
	key    string
	record []byte // the unsigned record JSON
	cancel context.CancelFunc
	done   chan struct{}
	// stored is when the record was last written (unix ns; 0: never).
	stored atomic.Int64
}

// Current says whether the record is in the bucket as far as this process
// knows: written within the TTL and not closed. A worker that cannot
// refresh its record (NATS away) is not current once the TTL has passed.
func (r *Registration) Current() error {
	t := r.stored.Load()
	switch {
	case t == 0:
		return errors.New("discovery: not registered")
	case time.Since(time.Unix(0, t)) > r.d.TTL():
		return fmt.Errorf("discovery: record not refreshed for %v (TTL %v)", time.Since(time.Unix(0, t)).Round(time.Millisecond), r.d.TTL())
	}
	return nil
}

// Register writes the record and refreshes it every TTL/3, and at once after
// a reconnect, until Close. Refresh failures are logged and retried: a worker
// keeps serving while NATS is away and re-registers when it returns.
func (d *Discovery) Register(ctx context.Context, in Instance) (*Registration, error) {
	if err := in.Validate(); err != nil {
		return nil, fmt.Errorf("discovery: register: %w", err)
	}
	in.SignedAt, in.Sig = 0, ""
	record, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("discovery: register: %w", err)
	}
	// Signed afresh on every refresh (put), so a copy grows stale.
	r := &Registration{d: d, key: instanceKey(in.Model, in.ID), record: record, done: make(chan struct{})}
	if err := r.put(ctx); err != nil {
		return nil, err
	}
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.cancel = cancel
	go r.loop(lctx)
	return r, nil
}

func (r *Registration) put(ctx context.Context) error {
	val := signRecord(r.d.cfg.Key, r.record, time.Now())
	kvb, err := r.d.bucket(ctx, false)
	if err == nil {
		_, err = kvb.Put(ctx, r.key, val)
		if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrNoStreamResponse) {
			if kvb, err = r.d.bucket(ctx, true); err == nil {
				_, err = kvb.Put(ctx, r.key, val)
			}
		}
	}
	if err != nil {
		return fmt.Errorf("discovery: put %s: %w", r.key, err)
	}
	r.stored.Store(time.Now().UnixNano())
	return nil
}

func (r *Registration) loop(ctx context.Context) {
	defer close(r.done)
	status := r.d.nc.StatusChanged(nats.CONNECTED)
	defer r.d.nc.RemoveStatusListener(status)
	every := max(r.d.TTL()/3, 100*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-status:
		}
		pctx, cancel := context.WithTimeout(ctx, every)
		err := r.put(pctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			r.d.log.Warn("discovery refresh failed; retrying", "key", r.key, "err", err)
		}
	}
}

// Close stops refreshing and deletes the record, so watchers drop the
// instance at once instead of after the TTL.
func (r *Registration) Close(ctx context.Context) error {
	r.cancel()
	<-r.done
	r.stored.Store(0)
	kvb, err := r.d.bucket(ctx, false)
	if err == nil {
		err = kvb.Delete(ctx, r.key)
	}
	if err != nil {
		return fmt.Errorf("discovery: deregister %s: %w", r.key, err)
	}
	return nil
}

// EventKind says what happened to an instance.
type EventKind uint8

const (
	InstanceAdded EventKind = iota + 1
	InstanceUpdated
	InstanceRemoved
)

func (k EventKind) String() string {
	switch k {
	case InstanceAdded:
		return "added"
	case InstanceUpdated:
		return "updated"
	case InstanceRemoved:
		return "removed"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Event is one change seen by a watcher. For removals only
// Instance.ID and Model are certain; the rest is the last known record.
type Event struct {
	Kind     EventKind
	Instance Instance
}

// Watcher follows the instances of one model.
type Watcher struct {
	d     *Discovery
	model string
	fn    func(Event)

	mu        sync.Mutex
	instances map[uint64]Instance

	bad    atomic.Int64
	cancel context.CancelFunc
	done   chan struct{}
	synced chan struct{}
}

// Watch calls fn (serially, from one goroutine) for every add, update and
// removal of model's instances, starting with the current ones. After a
// reconnect it re-reads the bucket and reconciles, so removals missed while
// disconnected are delivered. Bad records are logged, counted and skipped.
func (d *Discovery) Watch(ctx context.Context, model string, fn func(Event)) (*Watcher, error) {
	if model == "" {
		return nil, errors.New("discovery: watch: empty model")
	}
	wctx, cancel := context.WithCancel(ctx)
	w := &Watcher{d: d, model: model, fn: fn, instances: map[uint64]Instance{},
		cancel: cancel, done: make(chan struct{}), synced: make(chan struct{})}
	go w.run(wctx)
	return w, nil
}

// Synced is closed once the first snapshot has been delivered.
func (w *Watcher) Synced() <-chan struct{} { return w.synced }

// Instances returns the current instances, sorted by id.
func (w *Watcher) Instances() []Instance {
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := slices.Sorted(maps.Keys(w.instances))
	out := make([]Instance, len(ids))
	for i, id := range ids {
		out[i] = w.instances[id]
	}
	return out
}

// BadRecords counts records that did not parse, failed validation or named
// another model.
func (w *Watcher) BadRecords() int64 { return w.bad.Load() }

// Close stops the watcher and waits for it.
func (w *Watcher) Close() {
	w.cancel()
	<-w.done
}

func (w *Watcher) run(ctx context.Context) {
	defer close(w.done)
	status := w.d.nc.StatusChanged(nats.CONNECTED)
	defer w.d.nc.RemoveStatusListener(status)
	backoff := 100 * time.Millisecond
	first := true
	for ctx.Err() == nil {
		err := w.watchOnce(ctx, status, &first)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			w.d.log.Warn("discovery watch restarting", "model", w.model, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 2*time.Second)
		} else {
			backoff = 100 * time.Millisecond
		}
	}
}

// watchOnce runs one JetStream watch until it fails, the connection comes
// back after an outage (the watch is then rebuilt to resync), or ctx ends.
func (w *Watcher) watchOnce(ctx context.Context, status chan nats.Status, first *bool) error {
	kvb, err := w.d.bucket(ctx, !*first)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	kw, err := kvb.Watch(wctx, natsbus.ModelToken(w.model)+".*")
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	defer kw.Stop()
	seen := map[uint64]bool{}
	initial := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-status:
			return nil // reconnected: rebuild the watch and reconcile
		case e, ok := <-kw.Updates():
			if !ok {
				return errors.New("watch updates closed")
			}
			if e == nil {
				// End of the initial values: whatever we knew and did not
				// see is gone.
				initial = false
				w.reconcile(seen)
				if *first {
					*first = false
					close(w.synced)
				}
				continue
			}
			id, err := natsbus.ParseInstanceToken(e.Key())
			if err != nil {
				w.badRecord(e.Key(), err)
				continue
			}
			switch e.Operation() {
			case jetstream.KeyValueDelete, jetstream.KeyValuePurge:
				if !initial {
					w.remove(id)
				}
			default:
				in, err := w.d.parseSigned(e.Value(), time.Now())
				if err == nil && (in.ID != id || in.Model != w.model) {
					err = fmt.Errorf("record names instance %x of model %q", in.ID, in.Model)
				}
				if err != nil {
					w.badRecord(e.Key(), err)
					w.remove(id) // a record that went bad is no longer usable
					continue
				}
				if initial {
					seen[id] = true
				}
				w.upsert(in)
			}
		}
	}
}

func (w *Watcher) badRecord(key string, err error) {
	w.bad.Add(1)
	w.d.log.Warn("discovery: skipping bad record", "key", key, "err", err)
}

func (w *Watcher) upsert(in Instance) {
	w.mu.Lock()
	old, known := w.instances[in.ID]
	w.instances[in.ID] = in
	w.mu.Unlock()
	switch {
	case !known:
		w.emit(Event{Kind: InstanceAdded, Instance: in})
	case !sameInstance(old, in):
		w.emit(Event{Kind: InstanceUpdated, Instance: in})
	}
}

func (w *Watcher) remove(id uint64) {
	w.mu.Lock()
	old, known := w.instances[id]
	delete(w.instances, id)
	w.mu.Unlock()
	if known {
		w.emit(Event{Kind: InstanceRemoved, Instance: old})
	}
}

func (w *Watcher) reconcile(seen map[uint64]bool) {
	w.mu.Lock()
	var gone []uint64
	for id := range w.instances {
		if !seen[id] {
			gone = append(gone, id)
		}
	}
	w.mu.Unlock()
	for _, id := range gone {
		w.remove(id)
	}
}

func (w *Watcher) emit(ev Event) {
	if w.fn != nil {
		w.fn(ev)
	}
}

// sameInstance compares records but not their signatures, which change
// with every refresh.
func sameInstance(a, b Instance) bool {
	a.SignedAt, a.Sig, b.SignedAt, b.Sig = 0, "", 0, ""
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}
