package transfer

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/kv"
)

func TestMemSourcePins(t *testing.T) {
	m := NewMemSource(2, 64)
	hs := hashes(20, 4)
	m.Add(hs...)
	n, release := m.Pin(append(hs[:2:2], 12345, hs[3]))
	if n != 2 || m.Pins() != 1 {
		t.Fatalf("pinned %d (pins %d), want the 2-block prefix", n, m.Pins())
	}
	m.Remove(hs[0], hs[2])
	if m.Has(hs[0]) || m.Has(hs[2]) {
		t.Fatal("removed blocks still reported held")
	}
	// Pinned: still readable until released.
	p, err := m.ReadBlock(hs[0], nil)
	if err != nil || len(p) != 128 {
		t.Fatalf("pinned block after remove: %d bytes, %v", len(p), err)
	}
	if _, err := m.ReadBlock(hs[2], nil); err == nil {
		t.Fatal("unpinned removed block still readable")
	}
	release()
	release() // idempotent
	if m.Pins() != 0 {
		t.Fatalf("pins %d after release", m.Pins())
	}
	if _, err := m.ReadBlock(hs[0], nil); err == nil {
		t.Fatal("block survives its last pin after remove")
	}
	if n, _ := m.Pin(hs); n != 0 {
		t.Fatalf("prefix after removing block 0: %d", n)
	}
}

func TestPayloadVerifier(t *testing.T) {
	v := PayloadVerifier(3, 100)
	m := NewMemSource(3, 100)
	m.Add(5)
	p, _ := m.ReadBlock(5, []byte("keep"))
	if string(p[:4]) != "keep" {
		t.Fatal("ReadBlock did not append")
	}
	p = p[4:]
	if err := v(5, p); err != nil {
		t.Fatal(err)
	}
	if err := v(6, p); err == nil {
		t.Fatal("payload of another hash accepted")
	}
	if err := v(5, p[:299]); err == nil || !strings.Contains(err.Error(), "want 3 layers") {
		t.Fatalf("short payload: %v", err)
	}
	p[250] ^= 1
	if err := v(5, p); err == nil || !strings.Contains(err.Error(), "layer 2") || !strings.Contains(err.Error(), "byte 50") {
		t.Fatalf("flipped byte: %v", err)
	}
}

// rottingSource serves stored payloads zero-copy with the checksums taken
// when they were stored; rot alters memory afterwards.
type rottingSource struct {
	*storedSource
}

func (s rottingSource) ViewBlock(h uint64) ([]byte, error) {
	b, ok := s.blocks[h]
	if !ok {
		return nil, errors.New("not held")
	}
	return b, nil
}

func TestViewerWithStoredChecksumsCatchesRot(t *testing.T) {
	hs := hashes(21, 6)
	src := rottingSource{newStoredSource(hs, testLayers, testLayerSize)}
	ep := startServer(t, &Server{Source: src})
	c := newClient(t, ClientOptions{})
	res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs})
	if err != nil || !res.Success {
		t.Fatal(err)
	}
	checkBlocks(t, res, hs)
	for i, b := range res.Blocks {
		if b.Checksum != kv.Checksum(b.Payload) {
			t.Fatalf("block %d checksum", i)
		}
	}
	src.blocks[hs[2]][9] ^= 0x80 // memory rots after the checksum was stored
	res, err = c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs})
	if !errors.Is(err, ErrCorrupt) || res.Completed != 2 {
		t.Fatalf("rotted block: %d blocks, %v", res.Completed, err)
	}
}

func TestReceiveBuffer(t *testing.T) {
	hs := hashes(22, 10)
	src := NewMemSource(testLayers, testLayerSize)
	src.Add(hs...)
	ep := startServer(t, &Server{Source: src})
	c := newClient(t, ClientOptions{})
	for _, size := range []int{10*(32+testLayers*testLayerSize) + 1044, 3 * testLayers * testLayerSize, 10} {
		buf := make([]byte, size)
		res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs, Buffer: buf})
		if err != nil {
			t.Fatal(err)
		}
		checkBlocks(t, res, hs)
		// The first payload lands in the caller's memory when it fits.
		inBuf := size > 32 && &res.Blocks[0].Payload[0] == &buf[32]
		if fits := size >= 32+testLayers*testLayerSize; inBuf != fits {
			t.Errorf("buffer %d: first payload in caller memory = %v", size, inBuf)
		}
	}
	waitPins(t, src)
}

func TestShutdownWithFetchInFlight(t *testing.T) {
	mem := NewMemSource(testLayers, testLayerSize)
	hs := hashes(23, 50)
	mem.Add(hs...)
	started := make(chan struct{})
	src := &slowSource{MemSource: mem, delay: 10 * time.Millisecond}
	src.hook = func(i int) {
		if i == 0 {
			close(started)
		}
	}
	ln, err := newLoopbackListener()
	if err != nil {
		t.Fatal(err)
	}
	ep, _ := AdvertiseEndpoint("127.0.0.1", ln.port)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- (&Server{Source: src}).Serve(ctx, ln.Listener) }()
	c := newClient(t, ClientOptions{Timeout: 10 * time.Second})
	fetched := make(chan error, 1)
	go func() {
		_, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs})
		fetched <- err
	}()
	<-started
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if err := <-fetched; err == nil {
		t.Fatal("fetch succeeded across a shutdown")
	}
	if mem.Pins() != 0 {
		t.Fatalf("%d pins held after Serve returned", mem.Pins())
	}
	// New fetches now fail fast: nothing listens.
	if _, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs}); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("after shutdown: %v", err)
	}
}

func TestMetricsRegistration(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := NewMetrics(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := NewMetrics(reg); err == nil {
		t.Fatal("registering twice on one registry succeeded")
	}
	var m *Metrics // nil records nothing and must not panic
	m.begin(scopeFetch)
	m.end(scopeFetch, OutcomeSuccess, time.Millisecond, 1, 1)
	if _, err := NewMetrics(nil); err != nil {
		t.Fatal(err)
	}
}

func TestMaxActiveQueuesThenRefuses(t *testing.T) {
	mem := NewMemSource(testLayers, testLayerSize)
	hs := hashes(24, 10)
	mem.Add(hs...)
	started := make(chan struct{})
	src := &slowSource{MemSource: mem, delay: 30 * time.Millisecond}
	src.hook = func(i int) {
		if i == 0 {
			close(started)
		}
	}
	ep := startServer(t, &Server{Source: src, MaxActive: 1})
	c := newClient(t, ClientOptions{Timeout: 10 * time.Second})
	slow := make(chan error, 1)
	go func() {
		_, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs})
		slow <- err
	}()
	<-started
	// The only slot is busy for ~300 ms: a 50 ms fetch waits, then is refused.
	res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs[:1], Timeout: 50 * time.Millisecond})
	var re *RemoteError
	if !errors.As(err, &re) || re.Code != CodeBusy || res.Outcome != OutcomeRefused {
		// A refusal that lands after the client's own deadline reads as a
		// timeout; both mean the fetch did not jump the queue.
		if !errors.Is(err, ErrTimeout) {
			t.Fatalf("got %+v, %v; want busy (or timeout)", res, err)
		}
	}
	if err := <-slow; err != nil {
		t.Fatalf("the fetch holding the slot: %v", err)
	}
	// Once the slot is free a queued fetch gets it.
	if _, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs[:2]}); err != nil {
		t.Fatal(err)
	}
	waitPins(t, mem)
}

func TestContextDeadlineIsTimeout(t *testing.T) {
	mem := NewMemSource(testLayers, testLayerSize)
	hs := hashes(25, 10)
	mem.Add(hs...)
	ep := startServer(t, &Server{Source: &slowSource{MemSource: mem, delay: 20 * time.Millisecond}})
	c := newClient(t, ClientOptions{Timeout: 10 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Millisecond)
	defer cancel()
	res, err := c.Fetch(ctx, ep, FetchRequest{Hashes: hs})
	if !errors.Is(err, ErrTimeout) || res.Outcome != OutcomeTimeout || res.Completed != 0 {
		t.Fatalf("got %+v, %v; want timeout", res, err)
	}
	waitPins(t, mem)
}

// layerSim reads layers like engine/sim's Engine.
type layerSim struct {
	*MemSource
	failLayer int
}

func (s layerSim) ReadPayload(seq uint64, layer int, dst []byte) (int, error) {
	if layer == s.failLayer {
		return 0, errors.New("layer gone")
	}
	p := make([]byte, testLayerSize)
	kv.FillPayload(p, kv.SeqHash(seq), layer)
	return copy(dst, p), nil
}

func TestLayeredSource(t *testing.T) {
	mem := NewMemSource(testLayers, testLayerSize)
	hs := hashes(26, 5)
	mem.Add(hs...)
	ep := startServer(t, &Server{Source: Layered(layerSim{MemSource: mem, failLayer: -1}, testLayers, testLayerSize)})
	c := newClient(t, ClientOptions{})
	res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs, Verify: PayloadVerifier(testLayers, testLayerSize)})
	if err != nil {
		t.Fatal(err)
	}
	checkBlocks(t, res, hs)
	layers, sums, err := res.Blocks[1].Layers(testLayerSize)
	if err != nil || len(layers) != testLayers {
		t.Fatalf("Layers: %d, %v", len(layers), err)
	}
	for l := range layers {
		if err := kv.VerifyPayload(layers[l], kv.SeqHash(hs[1]), l, sums[l]); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := res.Blocks[0].Layers(testLayerSize + 1); err == nil {
		t.Fatal("uneven split accepted")
	}
	waitPins(t, mem)

	bad := Layered(layerSim{MemSource: mem, failLayer: 2}, testLayers, testLayerSize)
	if out, err := bad.ReadBlock(hs[0], []byte("x")); err == nil || string(out) != "x" || !strings.Contains(err.Error(), "layer 2") {
		t.Fatalf("failing layer: %q, %v", out, err)
	}
}

func TestReleaseRecyclesReceiveMemory(t *testing.T) {
	hs := hashes(27, 40)
	src := NewMemSource(testLayers, testLayerSize)
	src.Add(hs...)
	ep := startServer(t, &Server{Source: src})
	c := newClient(t, ClientOptions{})
	for i := 0; i < 5; i++ {
		res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs, Verify: PayloadVerifier(testLayers, testLayerSize)})
		if err != nil {
			t.Fatal(err)
		}
		checkBlocks(t, res, hs)
		if len(res.chunks) == 0 || res.pool == nil {
			t.Fatal("result carries no receive chunks to release")
		}
		res.Release()
		if res.Blocks != nil || res.Completed != 0 || res.chunks != nil {
			t.Fatalf("Release left %+v", res)
		}
		res.Release() // idempotent
	}
	// Caller memory is never pooled.
	buf := make([]byte, 1<<20)
	res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs, Buffer: buf})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.chunks) != 0 {
		t.Fatalf("%d chunks allocated although the buffer holds the response", len(res.chunks))
	}
	waitPins(t, src)
}

func TestChunkPool(t *testing.T) {
	var p chunkPool
	for _, n := range []int{1, 4096, 65536 + 1076} {
		b := p.get(n)
		if len(b) != n || cap(b) != n {
			t.Fatalf("get(%d) = len %d cap %d", n, len(b), cap(b))
		}
		p.put(b)
	}
	for i := 0; i < 2*maxChunkSizes; i++ {
		p.put(make([]byte, 100+i))
	}
	if len(p.sizes) != maxChunkSizes {
		t.Fatalf("%d sizes pooled, cap %d", len(p.sizes), maxChunkSizes)
	}
	p.put(make([]byte, 10, 20))           // sliced chunks are not pooled
	p.put(make([]byte, maxPooledChunk+1)) // nor huge ones
}
