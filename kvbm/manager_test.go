package kvbm

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/clock"
	"github.com/kvmesh/kvmesh/kv"
)

// chain makes n blocks of one sequence on the device and returns their
// store requests (device block i holds block i).
func chain(t *testing.T, dev *fakeDevice, base, n int) []StoreBlock {
	t.Helper()
	q := req("x", base, n*tBS)
	local, seq := kv.NewHasher(tBS, "", "").Blocks(q.Tokens)
	ids := dev.alloc(t, n)
	out := make([]StoreBlock, n)
	for i := range out {
		fillBlock(dev.blocks[ids[i]], seq[i])
		out[i] = StoreBlock{Device: ids[i], Meta: BlockMeta{Seq: seq[i], Local: local[i]}}
		if i > 0 {
			out[i].Meta.Parent, out[i].Meta.HasParent = seq[i-1], true
		}
	}
	return out
}

func seqsOfBlocks(bs []StoreBlock) []kv.SeqHash {
	out := make([]kv.SeqHash, len(bs))
	for i, b := range bs {
		out[i] = b.Meta.Seq
	}
	return out
}

// onboardAll matches seqs, onboards them into fresh device blocks and
// checks the bytes; it returns the staged tiers.
func onboardAll(t *testing.T, m *Manager, dev *fakeDevice, seqs []kv.SeqHash) []kv.Tier {
	t.Helper()
	st := m.Match(nil, seqs)
	ids := dev.alloc(t, len(st))
	n, err := m.Onboard(dev, st, ids)
	if err != nil || n != len(st) {
		t.Fatalf("onboard %d/%d: %v", n, len(st), err)
	}
	var tiers []kv.Tier
	for i, s := range st {
		if string(dev.blocks[ids[i]]) != string(blockPayload(seqs[i])) {
			t.Fatalf("block %d onboarded from %v holds the wrong bytes", i, s.Tier)
		}
		tiers = append(tiers, s.Tier)
	}
	dev.release(ids)
	return tiers
}

func TestDiskFilterAdmitsOnTheSecondSighting(t *testing.T) {
	vc := clock.NewVirtual(time.Time{})
	r := newRig(t, func(c *Connector) shape { return vllmShape{c.VLLMLeader()} }, 8, 8,
		func(c *Config) { c.Clock = vc })
	bs := chain(t, r.dev, 1, 2)
	if _, err := r.m.Offload(r.dev, bs); err != nil {
		t.Fatal(err)
	}
	if st := r.m.Stats(); st.OffloadedHost != 2 || st.FilteredDisk != 2 || st.DiskBlocks != 0 {
		t.Fatalf("first sighting: %+v", st)
	}
	// A second offer of block 0 (dedup on host) and a host hit on block 1
	// are second sightings within the window: both go to disk.
	if _, err := r.m.Offload(r.dev, bs[:1]); err != nil {
		t.Fatal(err)
	}
	r.m.Release(r.m.Match(nil, seqsOfBlocks(bs[1:])))
	if st := r.m.Stats(); st.DedupHost != 1 || st.OffloadedDisk != 2 || st.DiskBlocks != 2 {
		t.Fatalf("second sighting: %+v", st)
	}
	r.checkTierBytes(kv.TierDisk, seqsOfBlocks(bs))

	// After a decay interval a counter of 1 is forgotten.
	cs := chain(t, r.dev, 500, 1)
	r.m.Offload(r.dev, cs)
	vc.Advance(601 * time.Second)
	r.m.Release(r.m.Match(nil, seqsOfBlocks(cs)))
	if h, d := r.m.Holds(cs[0].Meta.Seq); !h || d {
		t.Fatalf("decayed block: host %v disk %v, want host only", h, d)
	}
}

func TestFrequencyFilter(t *testing.T) {
	t0 := clock.Epoch
	f := NewFrequencyFilter(FilterConfig{MaxEntries: 3}, t0)
	if f.ShouldOffload(1, t0) || !f.ShouldOffload(1, t0) {
		t.Fatal("threshold 2: no on the first sighting, yes on the second")
	}
	f.ShouldOffload(1, t0) // counter 4
	f.ShouldOffload(2, t0) // 1
	// Two intervals: 4 → 2, 2's 1 → gone.
	if !f.ShouldOffload(1, t0.Add(1200*time.Second)) || f.Len() != 1 {
		t.Fatalf("after decay: len %d", f.Len())
	}
	for h := kv.SeqHash(10); h < 14; h++ {
		f.ShouldOffload(h, t0.Add(1200*time.Second))
	}
	if f.Len() > 3 {
		t.Fatalf("max entries 3, have %d", f.Len())
	}
	off := NewFrequencyFilter(FilterConfig{Disabled: true}, t0)
	if !off.ShouldOffload(99, t0) {
		t.Fatal("a disabled filter admits everything")
	}
}

func TestHostThenDiskContinuation(t *testing.T) {
	r := newRig(t, func(c *Connector) shape { return vllmShape{c.VLLMLeader()} }, 2, 8,
		func(c *Config) { c.DiskFilter.Disabled = true })
	bs := chain(t, r.dev, 1, 4)
	r.m.Offload(r.dev, bs)
	// Host keeps the last two; offloading 0,1 again brings them back to
	// host (evicting 2,3), disk has all four.
	r.m.Offload(r.dev, bs[:2])
	st := r.m.Stats()
	if st.HostBlocks != 2 || st.DiskBlocks != 4 || st.EvictedHost != 4 {
		t.Fatalf("stats %+v", st)
	}
	tiers := onboardAll(t, r.m, r.dev, seqsOfBlocks(bs))
	if fmt.Sprint(tiers) != "[host host disk disk]" {
		t.Fatalf("tiers %v", tiers)
	}
	// Events: each tier saw its stores (chains coalesced) and host its evictions.
	var hostStored, diskStored, hostRemoved int
	for _, e := range r.events {
		switch {
		case e.Kind == kv.EventStored && e.Tier == kv.TierHost:
			hostStored += len(e.Blocks)
		case e.Kind == kv.EventStored && e.Tier == kv.TierDisk:
			diskStored += len(e.Blocks)
		case e.Kind == kv.EventRemoved && e.Tier == kv.TierHost:
			hostRemoved += len(e.Removed)
		}
		if e.ID == 0 || e.Tier == kv.TierDevice {
			t.Fatalf("bad event %+v", e)
		}
	}
	if hostStored != 6 || diskStored != 4 || hostRemoved != 4 {
		t.Fatalf("events: host stored %d removed %d, disk stored %d", hostStored, hostRemoved, diskStored)
	}
}

func TestBypassHostGoesStraightToDisk(t *testing.T) {
	r := newRig(t, func(c *Connector) shape { return trtShape{c.TRTLLMLeader()} }, 0, 8)
	if !r.m.BypassHost() {
		t.Fatal("disk only must bypass host")
	}
	q := req("a", 100, 13)
	r.dev.release(r.prefill(q, nil, 5))
	if st := r.m.Stats(); st.OffloadedDisk != 3 || st.FilteredDisk != 0 {
		t.Fatalf("bypass stats %+v", st)
	}
	if len(r.events) == 0 || r.events[0].Tier != kv.TierDisk || r.events[0].Kind != kv.EventStored {
		t.Fatalf("events %+v", r.events)
	}
	b := req("b", 100, 14)
	if n, _, _ := r.sh.match(b, 0); n != 12 {
		t.Fatalf("disk match %d", n)
	}
	ext := r.dev.alloc(t, 3)
	if err := r.sh.alloc("b", ext, 12, 0); err != nil {
		t.Fatal(err)
	}
	r.run(nil, nil, map[string]int{}, nil)
	for i, h := range seqsOf(b) {
		if string(r.dev.blocks[ext[i]]) != string(blockPayload(h)) {
			t.Fatalf("block %d", i)
		}
	}
	if info, _ := r.c.Slot("b"); info.LoadedDisk != 12 {
		t.Fatalf("slot %+v", info)
	}
}

func TestEvictionLowestPriorityThenLeastRecentlyReturned(t *testing.T) {
	h, _ := NewHostArena(3, tBB)
	m, err := NewManager(Config{BlockSize: tBS, BlockBytes: tBB, Host: h})
	if err != nil {
		t.Fatal(err)
	}
	dev := newFakeDevice(16)
	a, b, c := chain(t, dev, 1, 1), chain(t, dev, 100, 1), chain(t, dev, 200, 1)
	a[0].Meta.Priority, b[0].Meta.Priority, c[0].Meta.Priority = 5, 1, 5
	m.Offload(dev, a)
	m.Offload(dev, b)
	m.Offload(dev, c)
	// Touch a (pin and return) so c is now the least recently returned 5.
	m.Release(m.Match(nil, []kv.SeqHash{a[0].Meta.Seq}))
	d := chain(t, dev, 300, 1)
	d[0].Meta.Priority = 5
	m.Offload(dev, d)
	if hb, _ := m.Holds(b[0].Meta.Seq); hb {
		t.Fatal("priority 1 must go first")
	}
	e := chain(t, dev, 400, 1)
	e[0].Meta.Priority = 5
	m.Offload(dev, e)
	if hc, _ := m.Holds(c[0].Meta.Seq); hc {
		t.Fatal("among priority 5, c was returned least recently")
	}
	if ha, _ := m.Holds(a[0].Meta.Seq); !ha {
		t.Fatal("a was touched and must stay")
	}
	// Pinned blocks are never evicted: with every slot pinned, an offload
	// is dropped and counted.
	st := m.Match(nil, []kv.SeqHash{a[0].Meta.Seq})
	st = m.Match(st, []kv.SeqHash{d[0].Meta.Seq})
	st = m.Match(st, []kv.SeqHash{e[0].Meta.Seq})
	if n, _ := m.Offload(dev, chain(t, dev, 500, 1)); n != 0 || m.Stats().FullHost != 1 {
		t.Fatalf("offload into a pinned pool: %d, %+v", n, m.Stats())
	}
	m.Release(st)
}

func TestRecoverDiskDropsACorruptBlock(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/g3.pool"
	d, err := OpenDiskFile(path, 8, tBB)
	if err != nil || d.Reopened {
		t.Fatalf("%v reopened=%v", err, d != nil && d.Reopened)
	}
	m, _ := NewManager(Config{BlockSize: tBS, BlockBytes: tBB, Disk: d})
	dev := newFakeDevice(16)
	bs := chain(t, dev, 1, 4)
	if n, err := m.Offload(dev, bs); n != 4 || err != nil {
		t.Fatalf("offload %d %v", n, err)
	}
	slot2, _ := m.disk.lookup(bs[2].Meta.Seq)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	// Corrupt one block's payload on disk, as a crash or a bad sector would.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0xFF, 0x00, 0xFF}, d.PayloadOffset(int(slot2))+10); err != nil {
		t.Fatal(err)
	}
	f.Close()

	d2, err := OpenDiskFile(path, 8, tBB)
	if err != nil || !d2.Reopened {
		t.Fatalf("reopen: %v %v", err, d2 != nil && d2.Reopened)
	}
	defer d2.Close()
	var evs []kv.Event
	m2, _ := NewManager(Config{BlockSize: tBS, BlockBytes: tBB, Disk: d2, Events: func(b []kv.Event) { evs = append(evs, b...) }})
	rec, bad, err := m2.RecoverDisk()
	if err != nil || rec != 3 || bad != 1 {
		t.Fatalf("recover: %d ok, %d corrupt, %v", rec, bad, err)
	}
	if st := m2.Stats(); st.Corrupt != 1 || st.RecoveredDisk != 3 || st.DiskBlocks != 3 {
		t.Fatalf("stats %+v", st)
	}
	var announced []kv.EngineHash
	for _, e := range evs {
		if e.Kind != kv.EventStored || e.Tier != kv.TierDisk {
			t.Fatalf("event %+v", e)
		}
		for _, b := range e.Blocks {
			announced = append(announced, b.EngineHash)
		}
	}
	want := []uint64{uint64(bs[0].Meta.Seq), uint64(bs[1].Meta.Seq), uint64(bs[3].Meta.Seq)}
	if fmt.Sprint(announced) != fmt.Sprint(want) {
		t.Fatalf("announced %v, want %v", announced, want)
	}
	// The prefix stops at the dropped block; what is there onboards intact.
	if tiers := onboardAll(t, m2, dev, seqsOfBlocks(bs)); len(tiers) != 2 {
		t.Fatalf("match after recovery: %v", tiers)
	}
	// The freed slot is reused before any eviction.
	if n, _ := m2.Offload(dev, bs[2:3]); n != 1 || m2.Stats().EvictedDisk != 0 {
		t.Fatalf("re-offload: %d %+v", n, m2.Stats())
	}
	// A pool file of another geometry is replaced, not misread.
	d3, err := OpenDiskFile(path, 8, tBB*2)
	if err != nil || d3.Reopened {
		t.Fatalf("other geometry: %v", err)
	}
	d3.Close()
}

func TestManagerRejectsMismatchedStorage(t *testing.T) {
	h, _ := NewHostArena(2, 100)
	if _, err := NewManager(Config{BlockSize: tBS, BlockBytes: tBB, Host: h}); err == nil {
		t.Fatal("a host arena of another block size must be refused")
	}
	if _, err := NewManager(Config{BlockSize: 0, BlockBytes: tBB}); err == nil {
		t.Fatal("block size 0 must be refused")
	}
}

// sumFake is a fakeDevice that supplies checksums, possibly wrong ones.
type sumFake struct {
	*fakeDevice
	lie bool
}

func (d sumFake) BlockChecksum(id DeviceBlockID) (uint64, bool) {
	s := kv.Checksum(d.blocks[id])
	if d.lie {
		s++
	}
	return s, true
}

func TestDeviceSuppliedChecksumIsVerifiedOnOnboard(t *testing.T) {
	for _, lie := range []bool{false, true} {
		h, _ := NewHostArena(8, tBB)
		m, _ := NewManager(Config{BlockSize: tBS, BlockBytes: tBB, Host: h})
		dev := sumFake{newFakeDevice(16), lie}
		bs := chain(t, dev.fakeDevice, 1, 2)
		m.Offload(dev, bs)
		st := m.Match(nil, seqsOfBlocks(bs))
		n, err := m.Onboard(dev, st, dev.alloc(t, 2))
		if lie && (n != 0 || m.Stats().Corrupt != 1 || err == nil) {
			t.Fatalf("a wrong device checksum must fail the onboard: %d %v", n, err)
		}
		if !lie && (n != 2 || err != nil) {
			t.Fatalf("onboard %d %v", n, err)
		}
	}
}

// Blocks the size of real KV blocks take the host arena's streaming
// copies (and a length that is no multiple of the stride): every byte
// comes back, and a byte corrupted in the arena is caught on onboard.
func TestHostTierLargeBlocksRoundTrip(t *testing.T) {
	for _, bb := range []int{64 << 10, 64<<10 + 96} {
		t.Run(fmt.Sprint(bb), func(t *testing.T) {
			h, err := NewHostArena(4, bb)
			if err != nil {
				t.Fatal(err)
			}
			m, err := NewManager(Config{BlockSize: 16, BlockBytes: bb, Host: h})
			if err != nil {
				t.Fatal(err)
			}
			src, dst := newBenchDevice(3, bb), &benchDevice{}
			for range 3 {
				dst.blocks = append(dst.blocks, make([]byte, bb))
			}
			batch := storeBatch(nil, 0, 3)
			if n, err := m.Offload(src, batch); n != 3 || err != nil {
				t.Fatalf("offload %d %v", n, err)
			}
			n, err := m.Onboard(dst, m.Match(nil, seqsOfBlocks(batch)), ids(3))
			if n != 3 || err != nil {
				t.Fatalf("onboard %d %v", n, err)
			}
			for i := range src.blocks {
				if !bytes.Equal(dst.blocks[i], src.blocks[i]) {
					t.Fatalf("block %d differs after the round trip", i)
				}
			}
			s, _ := m.host.lookup(batch[1].Meta.Seq)
			h.View(int(s))[bb-1] ^= 1
			n, err = m.Onboard(dst, m.Match(nil, seqsOfBlocks(batch)), ids(3))
			var ce *CorruptError
			if n != 1 || !errors.As(err, &ce) || ce.Seq != batch[1].Meta.Seq || m.Stats().Corrupt != 1 {
				t.Fatalf("onboard over a corrupt arena slot: %d %v %+v", n, err, m.Stats())
			}
		})
	}
}

// pieceDevice is a fakeDevice that moves host-tier blocks itself
// (PieceDevice), as the sidecar's piece-by-piece staging does; sum, if
// set, replaces the checksum ReadBlock reports.
type pieceDevice struct {
	*fakeDevice
	reads, writes int
	sum           func(uint64) uint64
}

func (d *pieceDevice) ReadBlock(id DeviceBlockID, dst []byte) (uint64, error) {
	src, err := d.ReadView(id)
	if err != nil {
		return 0, err
	}
	d.reads++
	// Two pieces, copied and hashed apart.
	h := kv.NewChecksum()
	for _, p := range [][2]int{{0, tBB / 2}, {tBB / 2, tBB}} {
		copy(dst[p[0]:p[1]], src[p[0]:p[1]])
		h.Write(src[p[0]:p[1]])
	}
	if d.sum != nil {
		return d.sum(h.Sum64()), nil
	}
	return h.Sum64(), nil
}

func (d *pieceDevice) WriteBlock(id DeviceBlockID, src []byte) error {
	dst, err := d.WriteView(id)
	if err != nil {
		return err
	}
	d.writes++
	copy(dst, src)
	return nil
}

// A PieceDevice's blocks go to and come from host slots through
// ReadBlock/WriteBlock (hashed as they pass, verified on the way back);
// disk still reads and writes through views; a wrong reported checksum is
// caught on onboarding.
func TestPieceDevice(t *testing.T) {
	r := newRig(t, func(c *Connector) shape { return vllmShape{c.VLLMLeader()} }, 2, 8,
		func(c *Config) { c.DiskFilter.Disabled = true })
	pd := &pieceDevice{fakeDevice: r.dev}
	bs := chain(t, r.dev, 1, 4)
	if n, err := r.m.Offload(pd, bs); err != nil || n != 4 {
		t.Fatalf("offload: %d, %v", n, err)
	}
	if st := r.m.Stats(); pd.reads != 4 || st.HostBlocks != 2 || st.DiskBlocks != 4 {
		t.Fatalf("%d ReadBlock calls, stats %+v; want 4 and host 2, disk 4", pd.reads, st)
	}
	r.m.Offload(pd, bs[:2]) // 0 and 1 back to host (from the device again)
	if pd.reads != 6 {
		t.Fatalf("%d ReadBlock calls, want 6", pd.reads)
	}
	seqs := seqsOfBlocks(bs)
	st := r.m.Match(nil, seqs)
	ids := r.dev.alloc(t, len(st))
	if n, err := r.m.Onboard(pd, st, ids); err != nil || n != 4 {
		t.Fatalf("onboard %d: %v", n, err)
	}
	host := 0
	for i, s := range st {
		if !bytes.Equal(r.dev.blocks[ids[i]], blockPayload(seqs[i])) {
			t.Fatalf("block %d from %v holds the wrong bytes", i, s.Tier)
		}
		if s.Tier == kv.TierHost {
			host++
		}
	}
	if host != 2 || pd.writes != host {
		t.Fatalf("%d WriteBlock calls for %d host blocks", pd.writes, host)
	}
	r.dev.release(ids)

	// A block stored with a checksum that is not its bytes' is corrupt.
	r2 := newRig(t, func(c *Connector) shape { return vllmShape{c.VLLMLeader()} }, 4, 0)
	bad := &pieceDevice{fakeDevice: r2.dev, sum: func(s uint64) uint64 { return s ^ 1 }}
	cs := chain(t, r2.dev, 7, 1)
	r2.m.Offload(bad, cs)
	st2 := r2.m.Match(nil, seqsOfBlocks(cs))
	if len(st2) != 1 {
		t.Fatalf("matched %d blocks, want 1", len(st2))
	}
	if _, err := r2.m.Onboard(bad, st2, r2.dev.alloc(t, 1)); err == nil || r2.m.Stats().Corrupt != 1 {
		t.Fatalf("onboard of a mis-summed block: %v, stats %+v", err, r2.m.Stats())
	}
}
