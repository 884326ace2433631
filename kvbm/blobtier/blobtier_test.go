package blobtier

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/blob/memblob"

	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/kvbm"
	"github.com/kvmesh/kvmesh/kvbm/blobtier/blobtiertest"
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

// backend is one bucket driver under test: open gives a Store over the
// same bucket at every call (a second call is a restart), raw a handle on
// that bucket to look at and damage its objects.
type backend struct {
	open      func(t *testing.T, prefix string, slots int) *Store
	raw       *blob.Bucket
	keyPrefix string // the URL's key prefix before the store's
}

// backendNames are the drivers every store test runs against: memblob,
// fileblob and s3blob against an in-process S3 server, with and without a
// key prefix in its URL.
var backendNames = []string{"mem", "file", "s3", "s3-prefixed"}

func newBackend(t *testing.T, name string) backend {
	t.Helper()
	ctx := context.Background()
	var rawURL, keyPrefix string
	switch name {
	case "mem":
		b := memblob.OpenBucket(nil)
		t.Cleanup(func() { b.Close() })
		return backend{raw: b, open: func(t *testing.T, prefix string, slots int) *Store {
			st, err := New(ctx, b, prefix, slots, bb)
			if err != nil {
				t.Fatal(err)
			}
			return st
		}}
	case "file":
		rawURL = "file://" + t.TempDir()
	case "s3", "s3-prefixed":
		srv := blobtiertest.NewS3(t, "kv")
		blobtiertest.SetEnv(t, blobtiertest.AccessKey)
		rawURL = srv.URL("kv")
		if name == "s3-prefixed" {
			rawURL = strings.Replace(rawURL, "s3://kv?", "s3://kv/team/cache?", 1)
			keyPrefix = "team/cache/"
		}
	default:
		t.Fatalf("no backend %q", name)
	}
	b, _, err := openBucket(ctx, rawURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return backend{raw: b, keyPrefix: keyPrefix, open: func(t *testing.T, prefix string, slots int) *Store {
		st, err := Open(ctx, rawURL, prefix, slots, bb)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}}
}

func forEachBackend(t *testing.T, test func(t *testing.T, be backend)) {
	for _, name := range backendNames {
		t.Run(name, func(t *testing.T) { test(t, newBackend(t, name)) })
	}
}

// objects lists the keys under prefix.
func (be backend) objects(t *testing.T, prefix string) []string {
	t.Helper()
	var keys []string
	it := be.raw.List(&blob.ListOptions{Prefix: prefix})
	for {
		obj, err := it.Next(context.Background())
		if errors.Is(err, io.EOF) {
			return keys
		}
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, obj.Key)
	}
}

func TestObjectTierKeepsHostEvictions(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		st := be.open(t, "kvbm/w1/", 16)
		if k := st.Key(1); k != be.keyPrefix+"kvbm/w1/0000000000000001" {
			t.Fatalf("object key %q", k)
		}
		log := tierLog{}
		m := manager(t, 4, st, log)
		seqs, blocks := chain(10)
		offloadAll(t, m, blocks)
		s := m.Stats()
		if s.HostBlocks != 4 || s.ObjectBlocks != 6 || s.OffloadedObject != 6 || s.Errors != 0 {
			t.Fatalf("stats %+v, want 4 host, 6 object blocks", s)
		}
		for i, h := range seqs[:6] {
			if !m.HoldsObject(h) || !log[kv.TierExternal][kv.EngineHash(h)] {
				t.Fatalf("block %d: object tier holds %v, events say %v", i, m.HoldsObject(h), log[kv.TierExternal][kv.EngineHash(h)])
			}
			if ok, err := be.raw.Exists(ctx, st.Key(h)); !ok {
				t.Fatalf("no object %s for block %d: %v", st.Key(h), i, err)
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
		raw, err := be.raw.ReadAll(ctx, st.Key(h))
		if err != nil {
			t.Fatal(err)
		}
		raw[kvbm.BlockHeaderSize+3] ^= 0x40
		if err := be.raw.WriteAll(ctx, st.Key(h), raw, nil); err != nil {
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
	})
}

func TestObjectTierRecoversAfterRestart(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		st := be.open(t, "kvbm/w1/", 16)
		m := manager(t, 4, st, tierLog{})
		seqs, blocks := chain(10)
		offloadAll(t, m, blocks)
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		// Rot one object's payload and drop a stray object beside the blocks.
		raw, err := be.raw.ReadAll(ctx, st.Key(seqs[2]))
		if err != nil {
			t.Fatal(err)
		}
		raw[len(raw)-1] ^= 1
		if err := be.raw.WriteAll(ctx, st.Key(seqs[2]), raw, nil); err != nil {
			t.Fatal(err)
		}
		dir := strings.TrimSuffix(st.Key(0), fmt.Sprintf("%016x", 0))
		stray := dir + "stray"
		if err := be.raw.WriteAll(ctx, stray, []byte("x"), nil); err != nil {
			t.Fatal(err)
		}

		st2 := be.open(t, "kvbm/w1/", 16)
		log := tierLog{}
		m2 := manager(t, 4, st2, log)
		rec, corrupt, err := m2.RecoverObject()
		if err != nil || rec != 5 || corrupt != 1 {
			t.Fatalf("recovered %d, corrupt %d, %v; want 5 and 1", rec, corrupt, err)
		}
		if n := len(log[kv.TierExternal]); n != 5 {
			t.Fatalf("recovery announced %d object blocks, want 5", n)
		}
		if ok, err := be.raw.Exists(ctx, stray); ok || err != nil {
			t.Fatalf("stray object kept (%v, %v)", ok, err)
		}
		// The prefix before the rotten block loads, verified.
		if staged := onboard(t, m2, seqs[:2]); len(staged) != 2 {
			t.Fatalf("staged %d", len(staged))
		}
		if m2.HoldsObject(seqs[2]) || !m2.HoldsObject(seqs[3]) {
			t.Fatal("recovery kept the rotten block or lost a good one")
		}
		if err := st2.Close(); err != nil {
			t.Fatal(err)
		}

		// A restart with a smaller tier keeps what fits and deletes the rest.
		st3 := be.open(t, "kvbm/w1/", 2)
		n := 0
		if err := st3.Scan(func(int, kvbm.BlockMeta) { n++ }); err != nil {
			t.Fatal(err)
		}
		if keys := be.objects(t, dir); n != 2 || len(keys) != 2 {
			t.Fatalf("a 2-slot tier scanned %d blocks and left %d objects (%v)", n, len(keys), keys)
		}
	})
}

// TestObjectTierSlots: a slot given another block deletes its object;
// reads check the slot, the buffer and the object's header.
func TestObjectTierSlots(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		st := be.open(t, "kvbm/w2/", 2)
		a, b := kv.SeqHash(0xa1), kv.SeqHash(0xb2)
		if err := st.Put(0, payload(a), kvbm.BlockMeta{Seq: a, Sum: kv.Checksum(payload(a))}); err != nil {
			t.Fatal(err)
		}
		if err := st.Put(0, payload(b), kvbm.BlockMeta{Seq: b, Sum: kv.Checksum(payload(b))}); err != nil {
			t.Fatal(err)
		}
		if ok, _ := be.raw.Exists(ctx, st.Key(a)); ok {
			t.Fatal("the slot's previous object was not deleted")
		}
		dst := make([]byte, bb)
		if err := st.Get(0, dst); err != nil || string(dst) != string(payload(b)) {
			t.Fatalf("get slot 0: %v (bytes match: %v)", err, string(dst) == string(payload(b)))
		}
		for _, c := range []struct {
			slot int
			buf  []byte
			want string
		}{
			{1, dst, "holds no object"},
			{2, dst, "out of range"},
			{0, dst[:bb-1], "buffer of 255 bytes"},
		} {
			if err := st.Get(c.slot, c.buf); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("get slot %d, %d bytes: %v, want %q", c.slot, len(c.buf), err, c.want)
			}
		}
		// An object swapped for another block's is caught by its header.
		other := make([]byte, kvbm.BlockHeaderSize+bb)
		kvbm.EncodeBlockHeader(other, kvbm.BlockMeta{Seq: a}, bb)
		if err := be.raw.WriteAll(ctx, st.Key(b), other, nil); err != nil {
			t.Fatal(err)
		}
		if err := st.Get(0, dst); err == nil || !strings.Contains(err.Error(), "bad block header") {
			t.Fatalf("get of a swapped object: %v", err)
		}
	})
}

// closedPort is the URL of a loopback port nothing listens on.
func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := "http://" + ln.Addr().String()
	ln.Close()
	return u
}

// stalled is an HTTP server that never answers.
func stalled(t *testing.T) string {
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-done:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(done) })
	return srv.URL
}

func TestProbe(t *testing.T) {
	srv := blobtiertest.NewS3(t, "kv")
	blobtiertest.SetEnv(t, blobtiertest.AccessKey)
	stall := "s3://kv?region=us-east-1&use_path_style=true&endpoint=" + url.QueryEscape(stalled(t))
	for _, c := range []struct {
		name, url, key, want string
		timeout              time.Duration
	}{
		{"s3", srv.URL("kv"), blobtiertest.AccessKey, "", 0},
		{"s3 with a key prefix", strings.Replace(srv.URL("kv"), "kv?", "kv/a/b?", 1), blobtiertest.AccessKey, "", 0},
		{"s3, checksums only when required", srv.URL("kv", "request_checksum_calculation=when_required", "response_checksum_validation=when_required"), blobtiertest.AccessKey, "", 0},
		{"file", "file://" + t.TempDir() + "/g4", "", "", 0},
		{"missing bucket", srv.URL("nope"), blobtiertest.AccessKey, `bucket "nope" does not exist`, 0},
		{"wrong key", srv.URL("kv"), "AKIAWRONG", `cannot list bucket "kv": access denied: check the credentials`, 0},
		{"no credentials", srv.URL("kv"), "", `no usable credentials`, 0},
		{"unknown parameter", srv.URL("kv", "regoin=eu"), blobtiertest.AccessKey, `unknown query parameter "regoin"`, 0},
		// The SDK retries a refused dial twice after random backoffs of up
		// to 2 s and 4 s, inside the probe's own ProbeTimeout.
		{"refused connection", "s3://kv?region=us-east-1&use_path_style=true&endpoint=" + url.QueryEscape(closedPort(t)), blobtiertest.AccessKey, "cannot reach its endpoint", ProbeTimeout + 5*time.Second},
		{"stalled endpoint", stall, blobtiertest.AccessKey, "no answer in time", 300 * time.Millisecond},
		{"gs", "gs://bucket", "", "gs:// is not built in", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			blobtiertest.SetEnv(t, c.key)
			if c.timeout == 0 {
				c.timeout = 5 * time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
			defer cancel()
			start := time.Now()
			err := Probe(ctx, c.url)
			if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
				t.Fatalf("Probe(%s) = %v, want %q", c.url, err, c.want)
			}
			t.Logf("%v", err)
			if d := time.Since(start); d > c.timeout+time.Second {
				t.Fatalf("Probe took %v", d)
			}
		})
	}
	// The probe cleans up after itself.
	if n := srv.Objects(t, "kv", ""); n != 0 {
		t.Fatalf("the probes left %d objects", n)
	}
	if all, denied := srv.Requests(); denied == 0 || all == denied {
		t.Fatalf("server answered %d requests, denied %d", all, denied)
	}
}

// TestProbeSharedCredentials: credentials come from the AWS chain, here
// a profile of the shared credentials file named by the URL.
func TestProbeSharedCredentials(t *testing.T) {
	srv := blobtiertest.NewS3(t, "kv")
	blobtiertest.SetEnv(t, "")
	creds := filepath.Join(t.TempDir(), "credentials")
	if err := os.WriteFile(creds, []byte("[kvtest]\naws_access_key_id = "+blobtiertest.AccessKey+
		"\naws_secret_access_key = "+blobtiertest.SecretKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", creds)
	if err := Probe(context.Background(), srv.URL("kv", "profile=kvtest")); err != nil {
		t.Fatalf("profile kvtest: %v", err)
	}
	if err := Probe(context.Background(), srv.URL("kv", "profile=other")); err == nil || !strings.Contains(err.Error(), "other") {
		t.Fatalf("a profile the file lacks: %v", err)
	}
}

// TestObjectTierCallsTimeOut: a remote bucket that stops answering fails
// the call that waits on it, after the store's timeout.
func TestObjectTierCallsTimeOut(t *testing.T) {
	blobtiertest.SetEnv(t, blobtiertest.AccessKey)
	u := "s3://kv?region=us-east-1&use_path_style=true&endpoint=" + url.QueryEscape(stalled(t))
	st, err := Open(context.Background(), u, "kvbm/w/", 4, bb)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.timeout != OpTimeout {
		t.Fatalf("remote store's call timeout %v, want %v", st.timeout, OpTimeout)
	}
	st.timeout = 200 * time.Millisecond
	start := time.Now()
	err = st.Put(0, payload(1), kvbm.BlockMeta{Seq: 1})
	if err == nil || time.Since(start) > 2*time.Second {
		t.Fatalf("put to a stalled bucket: %v after %v", err, time.Since(start))
	}
	if err := st.Scan(func(int, kvbm.BlockMeta) {}); err == nil {
		t.Fatal("scan of a stalled bucket succeeded")
	}
}

func TestCheckURL(t *testing.T) {
	for _, c := range []struct {
		url, err string
	}{
		{"file:///var/kv", ""},
		{"mem://", ""},
		{"file://rel/dir", "absolute"},
		{"s3://bucket?region=us-east-1", ""},
		{"s3://bucket/some/prefix", ""},
		{"s3:///nobucket", "want s3://bucket"},
		{"gs://bucket", "gs:// is not built in"},
		{"azblob://c", "not built in"},
		{"ftp://x", "file:///, mem:// or s3://"},
		{"%zz", "invalid"},
	} {
		err := CheckURL(c.url)
		if (c.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("CheckURL(%q) = %v, want %q", c.url, err, c.err)
		}
	}
}
