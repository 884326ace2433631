package blobtier

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gocloud.dev/blob"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/kvbm"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// asyncTier is an Async over a slow mem:// bucket, closed with the test.
func asyncTier(t *testing.T, slots int, cfg AsyncConfig, delay time.Duration, gate chan struct{}) (*Async, *blob.Bucket, *slowBucket) {
	t.Helper()
	b, sb := newSlowBucket(delay, gate)
	st, err := New(context.Background(), b, "kvbm/w1/", slots, bb)
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewAsync(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = a.Close()
		b.Close()
	})
	return a, b, sb
}

// settleAll waits until the manager has registered want object blocks.
func settleAll(t *testing.T, m *kvbm.Manager, a *Async, want int) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, "object writes settled", func() bool {
		select {
		case <-a.Ready():
		case <-time.After(10 * time.Millisecond):
		}
		m.Settle()
		return m.Stats().ObjectBlocks == want && m.Stats().PendingObject == 0
	}, func() string { return fmt.Sprintf("%+v", m.Stats()) })
}

// checkObjects reads every block's object straight from the bucket and
// compares its payload with the block's bytes.
func checkObjects(t *testing.T, b *blob.Bucket, a *Async, seqs []kv.SeqHash) {
	t.Helper()
	for i, h := range seqs {
		raw, err := b.ReadAll(context.Background(), a.Key(h))
		if err != nil {
			t.Fatalf("block %d: %v", i, err)
		}
		if string(raw[kvbm.BlockHeaderSize:]) != string(payload(h)) {
			t.Fatalf("block %d: the object holds the wrong bytes", i)
		}
	}
}

// A 100 ms-per-put bucket: offload returns long before one put could
// finish; the blocks are registered and announced only once written.
func TestAsyncSlowBucketDoesNotSlowOffload(t *testing.T) {
	const delay = 100 * time.Millisecond
	a, b, sb := asyncTier(t, 16, AsyncConfig{Depth: 8, Writers: 4}, delay, nil)
	log := tierLog{}
	m := manager(t, 4, a, log)
	seqs, blocks := chain(10)
	start := time.Now()
	offloadAll(t, m, blocks)
	if took := time.Since(start); took >= delay {
		t.Fatalf("offload of 10 blocks (6 to the object tier) took %v, a put takes %v", took, delay)
	}
	s := m.Stats()
	if s.ObjectBlocks != 0 || s.PendingObject != 6 || s.OffloadedObject != 0 || len(log[kv.TierExternal]) != 0 {
		t.Fatalf("before any put completed: %+v, %d object events", s, len(log[kv.TierExternal]))
	}
	if !m.HoldsObject(seqs[0]) || len(m.Match(nil, seqs[:1])) != 0 {
		t.Fatal("a queued block must count as held (no second write) but not match")
	}
	settleAll(t, m, a, 6)
	if s := m.Stats(); s.OffloadedObject != 6 || s.Errors != 0 || sb.puts.Load() != 6 {
		t.Fatalf("after the writes: %+v, %d puts", s, sb.puts.Load())
	}
	for i, h := range seqs[:6] {
		if !log[kv.TierExternal][kv.EngineHash(h)] {
			t.Fatalf("block %d: written but not announced", i)
		}
	}
	checkObjects(t, b, a, seqs[:6])
	if staged := onboard(t, m, seqs[:6]); len(staged) != 6 || staged[0].Tier != kv.TierExternal {
		t.Fatalf("onboarded %d blocks", len(staged))
	}
}

// The host slots the evicted blocks lived in are overwritten while their
// writes wait: the staging copies still put the right bytes.
func TestAsyncEvictedSlotReusedWhileQueued(t *testing.T) {
	gate := make(chan struct{})
	a, b, _ := asyncTier(t, 16, AsyncConfig{Depth: 8, Writers: 2}, 0, gate)
	m := manager(t, 4, a, tierLog{})
	seqs, blocks := chain(12)
	offloadAll(t, m, blocks[:10])
	// Four more blocks overwrite every host slot again.
	d := newDev(12)
	for i, blk := range blocks {
		copy(d[i], payload(blk.Meta.Seq))
	}
	if _, err := m.Offload(d, blocks[10:]); err != nil {
		t.Fatal(err)
	}
	if p := m.Stats().PendingObject; p != 8 {
		t.Fatalf("%d writes pending, want 8", p)
	}
	close(gate)
	settleAll(t, m, a, 8)
	checkObjects(t, b, a, seqs[:8])
}

// A full queue drops the object copy, counted, without waiting.
func TestAsyncQueueFullDrops(t *testing.T) {
	gate := make(chan struct{})
	a, _, _ := asyncTier(t, 16, AsyncConfig{Depth: 2, Writers: 1}, 0, gate)
	m := manager(t, 4, a, tierLog{})
	seqs, blocks := chain(10)
	offloadAll(t, m, blocks)
	if s := m.Stats(); s.PendingObject != 2 || s.DroppedObject != 4 || s.HostBlocks != 4 {
		t.Fatalf("6 evictions into a 2-deep queue: %+v", s)
	}
	close(gate)
	settleAll(t, m, a, 2)
	if !m.HoldsObject(seqs[0]) || !m.HoldsObject(seqs[1]) || m.HoldsObject(seqs[2]) {
		t.Fatal("the object tier holds the wrong blocks")
	}
}

// A block whose bytes do not match its checksum is not written: the write
// fails verification, the slot is freed, nothing is announced.
func TestAsyncWriteVerified(t *testing.T) {
	a, b, _ := asyncTier(t, 16, AsyncConfig{Depth: 4}, 0, nil)
	log := tierLog{}
	m := manager(t, 1, a, log)
	seqs, blocks := chain(2)
	blocks[0].Meta.Sum = 1 // a lie the device tells (a Checksummer's sum)
	d := newDev(2)
	for i, blk := range blocks {
		copy(d[i], payload(blk.Meta.Seq))
	}
	if _, err := m.Offload(lyingDev{d, map[kvbm.DeviceBlockID]uint64{0: 1}}, blocks); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the failed write", func() bool {
		m.Settle()
		return m.Stats().PendingObject == 0
	})
	if s := m.Stats(); s.FailedObject != 1 || s.ObjectBlocks != 0 || len(log[kv.TierExternal]) != 0 {
		t.Fatalf("%+v, %d object events", s, len(log[kv.TierExternal]))
	}
	if ok, _ := b.Exists(context.Background(), a.Key(seqs[0])); ok {
		t.Fatal("an unverified block was written")
	}
}

// lyingDev reports the checksums in sums instead of its bytes'.
type lyingDev struct {
	dev
	sums map[kvbm.DeviceBlockID]uint64
}

func (d lyingDev) BlockChecksum(id kvbm.DeviceBlockID) (uint64, bool) {
	s, ok := d.sums[id]
	if !ok {
		s = kv.Checksum(d.dev[id])
	}
	return s, true
}

// A slot's old object is deleted before its new block is put, and a later
// write of the old block (evicted from host again) runs after that
// delete: with deletes slower than puts, the rewritten object survives.
func TestAsyncDeleteOrderedWithRewrite(t *testing.T) {
	a, b, sb := asyncTier(t, 2, AsyncConfig{Depth: 8, Writers: 4}, 0, nil)
	sb.delDelay = 30 * time.Millisecond
	seqs, blocks := chain(2)
	var got []kvbm.PutResult
	put := func(slot, i int) {
		t.Helper()
		m := blocks[i].Meta
		m.Sum = kv.Checksum(payload(seqs[i]))
		if !a.PutAsync(slot, payload(seqs[i]), m) {
			t.Fatal("queue full")
		}
	}
	wait := func(n int) {
		t.Helper()
		testutil.WaitFor(t, 10*time.Second, "writes", func() bool {
			got = a.Completed(got)
			return len(got) >= n
		})
		for _, r := range got {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
		}
	}
	put(0, 0) // A in slot 0
	wait(1)
	put(0, 1) // B replaces A in slot 0: delete A, put B
	put(1, 0) // A evicted again, written to slot 1
	wait(3)
	testutil.WaitFor(t, 10*time.Second, "deletes done", func() bool { return len(a.dels) == cap(a.dels) })
	for i, h := range seqs {
		if ok, _ := b.Exists(context.Background(), a.Key(h)); !ok {
			t.Fatalf("block %d: object missing", i)
		}
	}
}

// Close with writes in flight: drained within the drain time, cancelled
// after it; no goroutine is left either way (TestMain checks).
func TestAsyncCloseWithWritesInFlight(t *testing.T) {
	t.Run("drain", func(t *testing.T) {
		a, b, sb := asyncTier(t, 16, AsyncConfig{Depth: 8, Writers: 2, Drain: 10 * time.Second}, 20*time.Millisecond, nil)
		m := manager(t, 4, a, tierLog{})
		seqs, blocks := chain(10)
		offloadAll(t, m, blocks)
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		if sb.puts.Load() != 6 {
			t.Fatalf("%d puts after a draining close, want 6", sb.puts.Load())
		}
		checkObjects(t, b, a, seqs[:6])
		if a.PutAsync(0, payload(seqs[0]), blocks[0].Meta) || !a.Full() {
			t.Fatal("a closed queue takes writes")
		}
	})
	t.Run("cancel", func(t *testing.T) {
		gate := make(chan struct{})
		defer close(gate)
		a, b, sb := asyncTier(t, 16, AsyncConfig{Depth: 8, Writers: 2}, 0, gate)
		m := manager(t, 4, a, tierLog{})
		seqs, blocks := chain(10)
		offloadAll(t, m, blocks)
		start := time.Now()
		err := a.Close()
		if err == nil || !strings.Contains(err.Error(), "cancelled") {
			t.Fatalf("close with gated writes: %v", err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("close took %v", took)
		}
		if sb.puts.Load() != 0 {
			t.Fatalf("%d puts completed through a closed gate", sb.puts.Load())
		}
		for _, h := range seqs[:6] {
			if ok, _ := b.Exists(context.Background(), a.Key(h)); ok {
				t.Fatal("a cancelled write left an object")
			}
		}
		m.Settle()
		if s := m.Stats(); s.ObjectBlocks != 0 || s.FailedObject != 6 {
			t.Fatalf("after a cancelling close: %+v", s)
		}
	})
}
