package transfer

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	testLayers    = 4
	testLayerSize = 1024
)

func hashes(base uint64, n int) []uint64 {
	h := make([]uint64, n)
	for i := range h {
		h[i] = base*1_000_003 + uint64(i)*0x9E3779B97F4A7C15 + 1
	}
	return h
}

// startServer serves srv on a loopback port until the test ends and returns
// its endpoint.
func startServer(t testing.TB, srv *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve returned %v", err)
		}
	})
	ep, err := AdvertiseEndpoint("127.0.0.1", ln.Addr().(*net.TCPAddr).Port)
	if err != nil {
		t.Fatal(err)
	}
	return ep
}

// asyncAll makes every test client verify blocks on its second goroutine,
// however small the response (TestAsyncVerification).
var asyncAll bool

func newClient(t testing.TB, o ClientOptions) *Client {
	c := NewClient(o)
	if asyncAll {
		c.asyncMin = 0
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitPins waits for the source to release every pin (the server releases
// after its done frame is written, which may be after the client returns).
func waitPins(t *testing.T, src *MemSource) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, "every pin released", func() bool { return src.Pins() == 0 },
		func() string { return fmt.Sprintf("%d pins held", src.Pins()) })
}

func checkBlocks(t *testing.T, res FetchResult, want []uint64) {
	t.Helper()
	if res.Completed != len(want) || len(res.Blocks) != len(want) {
		t.Fatalf("completed %d, %d blocks; want %d", res.Completed, len(res.Blocks), len(want))
	}
	verify := PayloadVerifier(testLayers, testLayerSize)
	var total int64
	for i, b := range res.Blocks {
		if b.Hash != want[i] {
			t.Fatalf("block %d hash %x, want %x", i, b.Hash, want[i])
		}
		if err := verify(b.Hash, b.Payload); err != nil {
			t.Fatalf("block %d: %v", i, err)
		}
		total += int64(len(b.Payload))
	}
	if res.Bytes != total {
		t.Fatalf("Bytes %d, payloads hold %d", res.Bytes, total)
	}
}

func TestFetchFull(t *testing.T) {
	src := NewMemSource(testLayers, testLayerSize)
	hs := hashes(1, 32)
	src.Add(hs...)
	ep := startServer(t, &Server{Source: src})
	c := newClient(t, ClientOptions{})
	res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs, Verify: PayloadVerifier(testLayers, testLayerSize)})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Success || res.Outcome != OutcomeSuccess {
		t.Fatalf("success %v outcome %v", res.Success, res.Outcome)
	}
	checkBlocks(t, res, hs)
	waitPins(t, src)
}

func TestFetchPartialPrefix(t *testing.T) {
	src := NewMemSource(testLayers, testLayerSize)
	hs := hashes(2, 20)
	src.Add(hs...)
	src.Remove(hs[7]) // later blocks are held but not contiguous with the prefix
	ep := startServer(t, &Server{Source: src})
	c := newClient(t, ClientOptions{})
	res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Success || res.Outcome != OutcomePartial {
		t.Fatalf("success %v outcome %v", res.Success, res.Outcome)
	}
	checkBlocks(t, res, hs[:7])
	waitPins(t, src)
}

func TestFetchNotFoundKeepsConnection(t *testing.T) {
	src := NewMemSource(testLayers, testLayerSize)
	hs := hashes(3, 4)
	src.Add(hs...)
	ep := startServer(t, &Server{Source: src})
	c := newClient(t, ClientOptions{})
	res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hashes(99, 4)})
	var re *RemoteError
	if !errors.As(err, &re) || re.Code != CodeNotFound || res.Outcome != OutcomeNotFound || res.Success || res.Completed != 0 {
		t.Fatalf("got %+v, %v; want not_found", res, err)
	}
	if n := len(c.idle[mustAddr(t, ep)]); n != 1 {
		t.Fatalf("%d idle connections after not_found, want 1 (reusable)", n)
	}
	if _, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs}); err != nil {
		t.Fatal(err)
	}
	waitPins(t, src)
}

func mustAddr(t *testing.T, ep string) string {
	e, err := kv.ParseEndpoint(ep)
	if err != nil {
		t.Fatal(err)
	}
	return e.Addr()
}

func TestCorruptSourceCaughtByVerify(t *testing.T) {
	src := NewMemSource(testLayers, testLayerSize)
	hs := hashes(4, 10)
	src.Add(hs...)
	src.SetCorrupt(func(h uint64, p []byte) {
		if h == hs[3] {
			p[2*testLayerSize+17] ^= 0x40
		}
	})
	ep := startServer(t, &Server{Source: src})
	c := newClient(t, ClientOptions{})

	// The checksum is computed by the source over what it read, so bad
	// memory at the source passes the checksum; only Verify sees it.
	res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs})
	if err != nil || res.Completed != len(hs) {
		t.Fatalf("without Verify: %d blocks, %v", res.Completed, err)
	}
	res, err = c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs, Verify: PayloadVerifier(testLayers, testLayerSize)})
	if !errors.Is(err, ErrCorrupt) || res.Outcome != OutcomeCorrupt || res.Success {
		t.Fatalf("got %v outcome %v; want corrupt", err, res.Outcome)
	}
	if !strings.Contains(err.Error(), "layer 2") {
		t.Errorf("error %q does not name the layer", err)
	}
	checkBlocks(t, res, hs[:3])
	waitPins(t, src)
}

// flipProxy forwards one connection to target, flipping the byte at offset
// flipAt of the source→target stream.
func flipProxy(t *testing.T, target string, flipAt int64) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		down, err := ln.Accept()
		if err != nil {
			return
		}
		defer down.Close()
		up, err := net.Dial("tcp", mustAddr(t, target))
		if err != nil {
			return
		}
		defer up.Close()
		wg.Add(1)
		go func() { defer wg.Done(); io.Copy(up, down); up.Close() }()
		buf := make([]byte, 32<<10)
		var off int64
		for {
			n, err := up.Read(buf)
			if n > 0 {
				if flipAt >= off && flipAt < off+int64(n) {
					buf[flipAt-off] ^= 0x01
				}
				off += int64(n)
				if _, werr := down.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	ep, _ := AdvertiseEndpoint("127.0.0.1", ln.Addr().(*net.TCPAddr).Port)
	return ep
}

func TestCorruptInTransitCaughtByChecksum(t *testing.T) {
	src := NewMemSource(testLayers, testLayerSize)
	hs := hashes(5, 10)
	src.Add(hs...)
	ep := startServer(t, &Server{Source: src})
	frame := int64(headerLen + blockMetaLen + testLayers*testLayerSize)
	proxy := flipProxy(t, ep, 5*frame+headerLen+blockMetaLen+100) // inside block 5's payload
	c := newClient(t, ClientOptions{MaxIdlePerEndpoint: -1})
	res, err := c.Fetch(context.Background(), proxy, FetchRequest{Hashes: hs})
	if !errors.Is(err, ErrCorrupt) || res.Outcome != OutcomeCorrupt || res.Success {
		t.Fatalf("got %v outcome %v; want corrupt", err, res.Outcome)
	}
	if !strings.Contains(err.Error(), "checksum") {
		t.Errorf("error %q does not say checksum", err)
	}
	checkBlocks(t, res, hs[:5])
	waitPins(t, src)
}

func TestDigest(t *testing.T) {
	src := NewMemSource(testLayers, testLayerSize)
	hs := hashes(6, 3)
	src.Add(hs...)
	ep := startServer(t, &Server{Source: src, Digest: "llama-8b/bs16/fp16/tp1"})
	c := newClient(t, ClientOptions{})
	res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs, Digest: "llama-8b/bs32/fp16/tp1"})
	var re *RemoteError
	if !errors.As(err, &re) || re.Code != CodeDigestMismatch || res.Outcome != OutcomeRefused || res.Completed != 0 {
		t.Fatalf("got %+v, %v; want digest_mismatch refusal", res, err)
	}
	if !strings.Contains(re.Message, "bs32") || !strings.Contains(re.Message, "bs16") {
		t.Errorf("reason %q does not name both digests", re.Message)
	}
	for _, d := range []string{"llama-8b/bs16/fp16/tp1", ""} {
		if res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs, Digest: d}); err != nil || !res.Success {
			t.Errorf("digest %q: %v", d, err)
		}
	}
	waitPins(t, src)
}

func TestUnreachableFailsAsUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	ep, _ := AdvertiseEndpoint("127.0.0.1", port)
	c := newClient(t, ClientOptions{Timeout: 30 * time.Second})
	res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hashes(7, 2)})
	// Refused → ErrUnreachable, not ErrTimeout: the client did not wait.
	if !errors.Is(err, ErrUnreachable) || errors.Is(err, ErrTimeout) || res.Outcome != OutcomeUnreachable {
		t.Fatalf("got %v outcome %v; want unreachable", err, res.Outcome)
	}
}

// slowSource delays every ReadBlock and can run a hook before it returns.
type slowSource struct {
	*MemSource
	delay time.Duration
	hook  func(i int)
	reads atomic.Int32
}

func (s *slowSource) ReadBlock(h uint64, dst []byte) ([]byte, error) {
	i := int(s.reads.Add(1)) - 1
	time.Sleep(s.delay)
	if s.hook != nil {
		s.hook(i)
	}
	return s.MemSource.ReadBlock(h, dst)
}

func TestDeadlineWithSlowSource(t *testing.T) {
	mem := NewMemSource(testLayers, testLayerSize)
	hs := hashes(8, 10)
	mem.Add(hs...)
	ep := startServer(t, &Server{Source: &slowSource{MemSource: mem, delay: 20 * time.Millisecond}})
	c := newClient(t, ClientOptions{Timeout: 50 * time.Millisecond})
	res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs})
	if !errors.Is(err, ErrTimeout) || res.Outcome != OutcomeTimeout || res.Success || res.Completed != 0 || res.Blocks != nil {
		t.Fatalf("got %+v, %v; want timeout with no blocks", res, err)
	}
	waitPins(t, mem)
}

func TestLateDoneIsFailure(t *testing.T) {
	mem := NewMemSource(testLayers, testLayerSize)
	hs := hashes(9, 5)
	mem.Add(hs...)
	var skew atomic.Int64
	// The source reads its last block "after" the client's deadline: the
	// client's clock jumps, so everything (and done) arrives late.
	src := &slowSource{MemSource: mem, hook: func(i int) {
		if i == len(hs)-1 {
			skew.Store(int64(time.Hour))
		}
	}}
	ep := startServer(t, &Server{Source: src})
	c := newClient(t, ClientOptions{Timeout: 10 * time.Second})
	c.now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs})
	if !errors.Is(err, ErrTimeout) || res.Outcome != OutcomeTimeout || res.Success || res.Completed != 0 {
		t.Fatalf("got %+v, %v; want a timeout despite done arriving", res, err)
	}
	if !strings.Contains(err.Error(), "after the deadline") {
		t.Errorf("error %q should say done came after the deadline", err)
	}
	waitPins(t, mem)
}

func TestCancel(t *testing.T) {
	mem := NewMemSource(testLayers, testLayerSize)
	hs := hashes(10, 10)
	mem.Add(hs...)
	started := make(chan struct{})
	var once sync.Once
	ep := startServer(t, &Server{Source: &slowSource{MemSource: mem, delay: 20 * time.Millisecond,
		hook: func(int) { once.Do(func() { close(started) }) }}})
	c := newClient(t, ClientOptions{Timeout: 10 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-started; cancel() }()
	res, err := c.Fetch(ctx, ep, FetchRequest{Hashes: hs})
	if !errors.Is(err, context.Canceled) || res.Outcome != OutcomeCancelled || res.Completed != 0 {
		t.Fatalf("got %+v, %v; want cancelled", res, err)
	}
	waitPins(t, mem)
}

func TestSourceReadErrorKeepsPrefix(t *testing.T) {
	mem := NewMemSource(testLayers, testLayerSize)
	hs := hashes(11, 8)
	mem.Add(hs...)
	src := &failingSource{MemSource: mem, failAt: hs[4]}
	ep := startServer(t, &Server{Source: src})
	c := newClient(t, ClientOptions{})
	res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs})
	var re *RemoteError
	if !errors.As(err, &re) || re.Code != CodeSourceError || res.Success || res.Outcome != OutcomeFailed {
		t.Fatalf("got %+v, %v; want source_error", res, err)
	}
	checkBlocks(t, res, hs[:4])
	waitPins(t, mem)
}

type failingSource struct {
	*MemSource
	failAt uint64
}

func (s *failingSource) ReadBlock(h uint64, dst []byte) ([]byte, error) {
	if h == s.failAt {
		return dst, errors.New("disk read failed")
	}
	return s.MemSource.ReadBlock(h, dst)
}

func TestConcurrentFetches(t *testing.T) {
	src := NewMemSource(testLayers, testLayerSize)
	const prefixes = 8
	all := make([][]uint64, prefixes)
	for i := range all {
		all[i] = hashes(uint64(100+i), 16+i)
		src.Add(all[i]...)
	}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	ep := startServer(t, &Server{Source: src, Metrics: m})
	// The operation timeout is not under test here: 256 fetches queued on
	// a loaded 2-core machine can wait longer than the default second.
	c := newClient(t, ClientOptions{Metrics: m, Timeout: 30 * time.Second})
	const workers, each = 32, 8
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	var total atomic.Int64
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				hs := all[(w+i)%prefixes]
				res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs, Verify: PayloadVerifier(testLayers, testLayerSize)})
				if err != nil {
					errs <- err
					continue
				}
				if res.Completed != len(hs) {
					errs <- fmt.Errorf("worker %d: %d of %d blocks", w, res.Completed, len(hs))
				}
				total.Add(res.Bytes)
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	waitPins(t, src)
	if got := testutil.Value(t, reg, "kvmesh_transfer_bytes_total", "operation", "fetch"); got != float64(total.Load()) {
		t.Errorf("fetch bytes metric %v, delivered %d", got, total.Load())
	}
	if got := testutil.Value(t, reg, "kvmesh_transfer_bytes_total", "operation", "serve"); got != float64(total.Load()) {
		t.Errorf("serve bytes metric %v, delivered %d", got, total.Load())
	}
	if got := testutil.Value(t, reg, "kvmesh_transfer_duration_seconds_count", "scope", "fetch", "result", "success"); got != float64(workers*each) {
		t.Errorf("fetch/success observations %v, want %d", got, workers*each)
	}
	if got := testutil.Value(t, reg, "kvmesh_transfer_in_flight", "operation", "fetch"); got != 0 {
		t.Errorf("fetch in flight %v after all returned", got)
	}
}

func TestStalePooledConnectionIsRetried(t *testing.T) {
	src := NewMemSource(testLayers, testLayerSize)
	hs := hashes(12, 3)
	src.Add(hs...)
	ep := startServer(t, &Server{Source: src, IdleTimeout: 30 * time.Millisecond})
	c := newClient(t, ClientOptions{})
	if _, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond) // the source closes the idle pooled connection
	if res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs}); err != nil || !res.Success {
		t.Fatalf("fetch on a stale pooled connection: %v", err)
	}
	waitPins(t, src)
}

func TestBusy(t *testing.T) {
	src := NewMemSource(testLayers, testLayerSize)
	hs := hashes(13, 3)
	src.Add(hs...)
	ep := startServer(t, &Server{Source: src, MaxConns: 1})
	hold, err := net.Dial("tcp", mustAddr(t, ep))
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	// Make sure the held connection is registered before the next dial.
	hold.Write(appendFetch(nil, 1, fetchReq{timeoutMs: 1000, hashes: hs}))
	if _, err := io.ReadFull(hold, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, ClientOptions{})
	res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs})
	var re *RemoteError
	if !errors.As(err, &re) || re.Code != CodeBusy || res.Outcome != OutcomeRefused {
		t.Fatalf("got %+v, %v; want busy", res, err)
	}
	hold.Close()
	waitPins(t, src)
}

func TestClientRejectsBadRequests(t *testing.T) {
	c := newClient(t, ClientOptions{})
	ctx := context.Background()
	if _, err := c.Fetch(ctx, "tcp://127.0.0.1:1", FetchRequest{}); err == nil {
		t.Error("empty hashes accepted")
	}
	if _, err := c.Fetch(ctx, "tcp://127.0.0.1:1", FetchRequest{Hashes: make([]uint64, MaxHashes+1)}); err == nil {
		t.Error("too many hashes accepted")
	}
	if _, err := c.Fetch(ctx, "tcp://0.0.0.0:1", FetchRequest{Hashes: []uint64{1}}); !errors.Is(err, kv.ErrWildcardHost) {
		t.Errorf("wildcard endpoint: %v", err)
	}
	if _, err := c.Fetch(ctx, "tcp://127.0.0.1:1", FetchRequest{Hashes: []uint64{1}, Digest: strings.Repeat("x", 256)}); err == nil {
		t.Error("long digest accepted")
	}
}

// rawExchange sends raw bytes to a server and returns what comes back until
// the server closes the connection or 2 s pass.
func rawExchange(t *testing.T, ep string, send []byte) []byte {
	t.Helper()
	conn, err := net.Dial("tcp", mustAddr(t, ep))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write(send); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("server did not close the connection: %v (read %d bytes)", err, len(got))
	}
	return got
}

func refuseCode(t *testing.T, got []byte) Code {
	t.Helper()
	if len(got) < headerLen {
		t.Fatalf("no refuse frame (%d bytes)", len(got))
	}
	h, err := parseHeader(got)
	if err != nil || h.typ != typeRefuse || int(h.length) != len(got)-headerLen {
		t.Fatalf("want one refuse frame, got header %+v err %v (%d bytes)", h, err, len(got))
	}
	st, err := decodeStatus(got[headerLen:])
	if err != nil {
		t.Fatal(err)
	}
	return st.code
}

func TestServerRejectsMalformedFrames(t *testing.T) {
	src := NewMemSource(testLayers, testLayerSize)
	hs := hashes(14, 3)
	src.Add(hs...)
	ep := startServer(t, &Server{Source: src})

	good := appendFetch(nil, 7, fetchReq{timeoutMs: 1000, digest: "d", hashes: hs})
	mutate := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	hdr := func(version uint8, typ frameType, length uint32) []byte {
		b := make([]byte, headerLen)
		putHeader(b, header{version: version, typ: typ, op: 1, length: length})
		return b
	}

	if got := rawExchange(t, ep, []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); len(got) != 0 {
		t.Errorf("non-protocol peer got %q, want silent close", got)
	}
	cases := []struct {
		name string
		send []byte
		want Code
	}{
		{"version 2", hdr(2, typeFetch, 0), CodeUnsupportedVersion},
		{"absurd length", hdr(Version, typeFetch, 0xFFFFFFFF), CodeBadRequest},
		{"block frame to a source", hdr(Version, typeBlock, 0), CodeBadRequest},
		{"unknown type", hdr(Version, 99, 0), CodeBadRequest},
		{"empty fetch", hdr(Version, typeFetch, 0), CodeBadRequest},
		{"count overruns", mutate(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[headerLen+10+1:], 1000)
			return b
		}), CodeBadRequest},
		{"zero count", mutate(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[headerLen+10+1:], 0)
			return b
		}), CodeBadRequest},
		{"digest overruns", mutate(func(b []byte) []byte {
			binary.LittleEndian.PutUint16(b[headerLen+8:], 200)
			return b
		}), CodeBadRequest},
		{"unknown flags", mutate(func(b []byte) []byte {
			b[headerLen+4] = 1
			return b
		}), CodeBadRequest},
		{"zero timeout", mutate(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[headerLen:], 0)
			return b
		}), CodeBadRequest},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := refuseCode(t, rawExchange(t, ep, c.send)); got != c.want {
				t.Errorf("code %v, want %v", got, c.want)
			}
		})
	}
	// Truncated frames: the server waits for the rest, then the peer leaves.
	conn, err := net.Dial("tcp", mustAddr(t, ep))
	if err != nil {
		t.Fatal(err)
	}
	conn.Write(good[:len(good)-5])
	conn.Close()

	// After all that the server still serves.
	c := newClient(t, ClientOptions{})
	if res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs}); err != nil || !res.Success {
		t.Fatalf("server broken after malformed frames: %v", err)
	}
	waitPins(t, src)
}

// fakeSource answers the first request on each connection with a canned
// response, to test the client against hostile or broken sources.
func fakeSource(t *testing.T, respond func(op uint32, req fetchReq) []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close()
				conn.SetDeadline(time.Now().Add(5 * time.Second))
				var hb [headerLen]byte
				h, err := readHeader(conn, &hb)
				if err != nil {
					return
				}
				p := make([]byte, h.length)
				if _, err := io.ReadFull(conn, p); err != nil {
					return
				}
				r, err := decodeFetch(p)
				if err != nil {
					return
				}
				conn.Write(respond(h.op, r))
				conn.(*net.TCPConn).CloseWrite() // the response is all there is
				io.Copy(io.Discard, conn)
			}()
		}
	}()
	ep, _ := AdvertiseEndpoint("127.0.0.1", ln.Addr().(*net.TCPAddr).Port)
	return ep
}

func blockFrame(op, idx uint32, hash uint64, payload []byte, sum uint64) []byte {
	b := make([]byte, headerLen+blockMetaLen+len(payload))
	putBlockMeta(b, op, idx, hash, sum, len(payload))
	copy(b[headerLen+blockMetaLen:], payload)
	return b
}

func TestClientRejectsHostileSources(t *testing.T) {
	payload := bytes.Repeat([]byte{7}, 64)
	sum := checksum(payload)
	cases := []struct {
		name    string
		respond func(op uint32, r fetchReq) []byte
		errPart string
	}{
		{"absurd block length", func(op uint32, r fetchReq) []byte {
			b := make([]byte, headerLen)
			putHeader(b, header{version: Version, typ: typeBlock, op: op, length: 0xFFFFFFF0})
			return b
		}, "outside"},
		{"wrong op", func(op uint32, r fetchReq) []byte {
			return blockFrame(op+1, 0, r.hashes[0], payload, sum)
		}, "operation"},
		{"out of order", func(op uint32, r fetchReq) []byte {
			return blockFrame(op, 1, r.hashes[1], payload, sum)
		}, "out of order"},
		{"unrequested hash", func(op uint32, r fetchReq) []byte {
			return blockFrame(op, 0, r.hashes[0]+1, payload, sum)
		}, "not requested"},
		{"done count lies", func(op uint32, r fetchReq) []byte {
			b := blockFrame(op, 0, r.hashes[0], payload, sum)
			return appendStatus(b, typeDone, op, status{completed: 2, success: true})
		}, "done reports 2"},
		{"block size changes", func(op uint32, r fetchReq) []byte {
			b := blockFrame(op, 0, r.hashes[0], payload, sum)
			return append(b, blockFrame(op, 1, r.hashes[1], payload[:10], checksum(payload[:10]))...)
		}, "after blocks of"},
		{"bad magic", func(op uint32, r fetchReq) []byte {
			return []byte("HTTP/1.1 400 Bad Request\r\n\r\n")
		}, "magic"},
		{"fetch frame from a source", func(op uint32, r fetchReq) []byte {
			return appendFetch(nil, op, r)
		}, "unexpected fetch"},
		{"closes mid-stream", func(op uint32, r fetchReq) []byte {
			b := blockFrame(op, 0, r.hashes[0], payload, sum)
			return b[:len(b)-3]
		}, "unexpected EOF"},
	}
	c := newClient(t, ClientOptions{MaxBlockBytes: 1 << 20})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ep := fakeSource(t, tc.respond)
			res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: []uint64{1, 2, 3}})
			if err == nil || res.Success || !strings.Contains(err.Error(), tc.errPart) {
				t.Fatalf("got %+v, %v; want failure containing %q", res, err, tc.errPart)
			}
			if res.Completed > 1 {
				t.Fatalf("completed %d", res.Completed)
			}
		})
	}
}

func checksum(b []byte) uint64 { return kv.Checksum(b) }

type loopbackListener struct {
	net.Listener
	port int
}

func newLoopbackListener() (loopbackListener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return loopbackListener{}, err
	}
	return loopbackListener{ln, ln.Addr().(*net.TCPAddr).Port}, nil
}
