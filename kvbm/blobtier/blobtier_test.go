package blobtier

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gocloud.dev/blob/memblob"

	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/kvbm"
)

const (
	bb = 256
	bs = 4
)

// dev is a device of n blocks of real bytes.
type dev [][]byte

func newDev(n int) dev {
	d := make(dev, n)
	for i := range d {
		d[i] = make([]byte, bb)
	}
	return d
}

func (d dev) ReadView(id kvbm.DeviceBlockID) ([]byte, error)  { return d[id], nil }
func (d dev) WriteView(id kvbm.DeviceBlockID) ([]byte, error) { return d[id], nil }

func payload(h kv.SeqHash) []byte {
	b := make([]byte, bb)
	kv.FillPayload(b, h, 0)
	return b
}

// chain is n blocks of one prompt: sequence hashes and metadata.
func chain(n int) ([]kv.SeqHash, []kvbm.StoreBlock) {
	seqs := make([]kv.SeqHash, n)
	blocks := make([]kvbm.StoreBlock, n)
	var parent kv.SeqHash
	for i := range seqs {
		seqs[i] = kv.SeqHash(0x1000 + uint64(i)*0x9e3779b97f4a7c15)
		blocks[i] = kvbm.StoreBlock{Device: kvbm.DeviceBlockID(i),
			Meta: kvbm.BlockMeta{Seq: seqs[i], Local: kv.LocalHash(i + 1), Parent: parent, HasParent: i > 0}}
		parent = seqs[i]
	}
	return seqs, blocks
}

type tierLog map[kv.Tier]map[kv.EngineHash]bool

func (l tierLog) sink(batch []kv.Event) {
	for _, e := range batch {
		if l[e.Tier] == nil {
			l[e.Tier] = map[kv.EngineHash]bool{}
		}
		for _, b := range e.Blocks {
			l[e.Tier][b.EngineHash] = true
		}
		for _, h := range e.Removed {
			delete(l[e.Tier], h)
		}
	}
}

func manager(t *testing.T, host int, obj kvbm.Storage, log tierLog) *kvbm.Manager {
	t.Helper()
	cfg := kvbm.Config{BlockSize: bs, BlockBytes: bb, Object: obj, Events: log.sink}
	if host > 0 {
		h, err := kvbm.NewHostArena(host, bb)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Host = h
	}
	m, err := kvbm.NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// offloadAll writes n blocks through a 4-block host tier: the first n-4
// are evicted to the object tier.
func offloadAll(t *testing.T, m *kvbm.Manager, blocks []kvbm.StoreBlock) {
	t.Helper()
	d := newDev(len(blocks))
	for i, b := range blocks {
		copy(d[i], payload(b.Meta.Seq))
	}
	if _, err := m.Offload(d, blocks); err != nil {
		t.Fatal(err)
	}
}

// onboard matches seqs and loads them into a fresh device, checking bytes.
func onboard(t *testing.T, m *kvbm.Manager, seqs []kv.SeqHash) []kvbm.Staged {
	t.Helper()
	staged := m.Match(nil, seqs)
	d := newDev(len(staged))
	ids := make([]kvbm.DeviceBlockID, len(staged))
	for i := range ids {
		ids[i] = kvbm.DeviceBlockID(i)
	}
	n, err := m.Onboard(d, staged, ids)
	if err != nil {
		t.Fatalf("onboard: %d blocks, %v", n, err)
	}
	for i := 0; i < n; i++ {
		if string(d[i]) != string(payload(seqs[i])) {
			t.Fatalf("device block %d holds the wrong bytes", i)
		}
	}
	return staged
}

func TestMemObjectTierKeepsHostEvictions(t *testing.T) {
	ctx := context.Background()
	b := memblob.OpenBucket(nil)
	defer b.Close()
	st, err := New(ctx, b, "kvbm/w1/", 16, bb)
	if err != nil {
		t.Fatal(err)
	}
	log := tierLog{}
	m := manager(t, 4, st, log)
	seqs, blocks := chain(10)
	offloadAll(t, m, blocks)
	s := m.Stats()
	if s.HostBlocks != 4 || s.ObjectBlocks != 6 || s.OffloadedObject != 6 {
		t.Fatalf("stats %+v, want 4 host, 6 object blocks", s)
	}
	for i, h := range seqs[:6] {
		if !m.HoldsObject(h) || !log[kv.TierExternal][kv.EngineHash(h)] {
			t.Fatalf("block %d: object tier holds %v, events say %v", i, m.HoldsObject(h), log[kv.TierExternal][kv.EngineHash(h)])
		}
		if ok, _ := b.Exists(ctx, st.Key(h)); !ok {
			t.Fatalf("no object for block %d", i)
		}
	}
	// The prefix comes back object → host → device, then from host.
	staged := onboard(t, m, seqs[:6])
	if len(staged) != 6 || staged[0].Tier != kv.TierExternal {
		t.Fatalf("staged %d blocks, first from %v", len(staged), staged[0].Tier)
	}
	s = m.Stats()
	if s.OnboardedObject != 6 || s.MatchedObject != 6 || s.Corrupt != 0 {
		t.Fatalf("stats %+v", s)
	}
	if host, _ := m.Holds(seqs[5]); !host {
		t.Fatal("an object block onboarded through host is not a host block")
	}

	// A rotten object fails its checksum: dropped, counted, the load stops.
	h := seqs[8]
	if host, _ := m.Holds(h); host {
		// Evict it from host first: offload 4 more blocks.
		_, more := chain(20)
		offloadAll(t, m, more[12:16])
	}
	if !m.HoldsObject(h) {
		t.Fatal("block 8 not in the object tier")
	}
	raw, err := b.ReadAll(ctx, st.Key(h))
	if err != nil {
		t.Fatal(err)
	}
	raw[kvbm.BlockHeaderSize+3] ^= 0x40
	if err := b.WriteAll(ctx, st.Key(h), raw, nil); err != nil {
		t.Fatal(err)
	}
	staged = m.Match(nil, []kv.SeqHash{h})
	if len(staged) != 1 {
		t.Fatalf("matched %d", len(staged))
	}
	_, err = m.Onboard(newDev(1), staged, []kvbm.DeviceBlockID{0})
	var ce *kvbm.CorruptError
	if !errors.As(err, &ce) || ce.Tier != kv.TierExternal {
		t.Fatalf("onboarding a rotten object: %v", err)
	}
	if m.HoldsObject(h) || m.Stats().Corrupt != 1 {
		t.Fatalf("rotten object still held (%v) or not counted (%+v)", m.HoldsObject(h), m.Stats())
	}
}

func TestFileObjectTierRecoversAfterRestart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	url := "file://" + dir
	st, err := Open(ctx, url, "kvbm/w1/", 16, bb)
	if err != nil {
		t.Fatal(err)
	}
	m := manager(t, 4, st, tierLog{})
	seqs, blocks := chain(10)
	offloadAll(t, m, blocks)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	// Rot one object's payload and drop a stray file beside the blocks.
	obj := filepath.Join(dir, "kvbm", "w1", fmt.Sprintf("%016x", uint64(seqs[2])))
	raw, err := os.ReadFile(obj)
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)-1] ^= 1
	if err := os.WriteFile(obj, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kvbm", "w1", "stray"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}

	st2, err := Open(ctx, url, "kvbm/w1/", 16, bb)
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	log := tierLog{}
	m2 := manager(t, 4, st2, log)
	rec, corrupt, err := m2.RecoverObject()
	if err != nil || rec != 5 || corrupt != 1 {
		t.Fatalf("recovered %d, corrupt %d, %v; want 5 and 1", rec, corrupt, err)
	}
	if n := len(log[kv.TierExternal]); n != 5 {
		t.Fatalf("recovery announced %d object blocks, want 5", n)
	}
	if _, err := os.Stat(filepath.Join(dir, "kvbm", "w1", "stray")); !os.IsNotExist(err) {
		t.Fatalf("stray object kept: %v", err)
	}
	// The prefix before the rotten block loads, verified.
	if staged := onboard(t, m2, seqs[:2]); len(staged) != 2 {
		t.Fatalf("staged %d", len(staged))
	}
	if m2.HoldsObject(seqs[2]) || !m2.HoldsObject(seqs[3]) {
		t.Fatal("recovery kept the rotten block or lost a good one")
	}
}

func TestCheckURL(t *testing.T) {
	for _, c := range []struct {
		url, err string
	}{
		{"file:///var/kv", ""},
		{"mem://", ""},
		{"file://rel/dir", "absolute"},
		{"s3://bucket?region=us-east-1", "not built in"},
		{"ftp://x", "file:///"},
		{"%zz", "invalid"},
	} {
		err := CheckURL(c.url)
		if (c.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("CheckURL(%q) = %v, want %q", c.url, err, c.err)
		}
	}
}
