package transfer

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestAsyncVerification reruns the client tests with every response
// verified on the verifier goroutine, so that path meets corruption (at
// the source and in transit), deadlines, cancellation, source errors and
// hostile sources too.
func TestAsyncVerification(t *testing.T) {
	asyncAll = true
	defer func() { asyncAll = false }()
	for _, tc := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"FetchFull", TestFetchFull},
		{"FetchPartialPrefix", TestFetchPartialPrefix},
		{"FetchNotFoundKeepsConnection", TestFetchNotFoundKeepsConnection},
		{"CorruptSourceCaughtByVerify", TestCorruptSourceCaughtByVerify},
		{"CorruptInTransitCaughtByChecksum", TestCorruptInTransitCaughtByChecksum},
		{"DeadlineWithSlowSource", TestDeadlineWithSlowSource},
		{"LateDoneIsFailure", TestLateDoneIsFailure},
		{"Cancel", TestCancel},
		{"SourceReadErrorKeepsPrefix", TestSourceReadErrorKeepsPrefix},
		{"ConcurrentFetches", TestConcurrentFetches},
		{"ClientRejectsHostileSources", TestClientRejectsHostileSources},
	} {
		t.Run(tc.name, tc.f)
	}
}

// TestLargeFetchCorruptMidway: a response past asyncVerifyMin (verified
// while it is read) with bad bytes in block 37 of 64 delivers exactly
// blocks 0..36, whether the checksum or Verify catches it.
func TestLargeFetchCorruptMidway(t *testing.T) {
	const layers, layerSize = 2, 16 << 10 // 64 × 32 KiB = 2 MiB
	hs := hashes(40, 64)
	verify := PayloadVerifier(layers, layerSize)

	// Rot at the source: the source checksums what it read, only Verify
	// sees it.
	src := NewMemSource(layers, layerSize)
	src.Add(hs...)
	src.SetCorrupt(func(h uint64, p []byte) {
		if h == hs[37] {
			p[layerSize+5] ^= 0x10
		}
	})
	ep := startServer(t, &Server{Source: src})
	c := newClient(t, ClientOptions{})
	res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs, Verify: verify})
	if !errors.Is(err, ErrCorrupt) || res.Outcome != OutcomeCorrupt || res.Success || !strings.Contains(err.Error(), "block 37") {
		t.Fatalf("got %v, outcome %v; want block 37 corrupt", err, res.Outcome)
	}
	checkLarge(t, res, hs[:37], verify)
	// The same client fetches cleanly afterwards.
	src.SetCorrupt(nil)
	if res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs, Verify: verify}); err != nil || res.Completed != len(hs) {
		t.Fatalf("clean fetch: %d blocks, %v", res.Completed, err)
	}

	// A flipped bit in transit: the checksum catches it.
	frame := int64(headerLen + blockMetaLen + layers*layerSize)
	proxy := flipProxy(t, ep, 37*frame+headerLen+blockMetaLen+1000)
	c2 := newClient(t, ClientOptions{MaxIdlePerEndpoint: -1})
	res, err = c2.Fetch(context.Background(), proxy, FetchRequest{Hashes: hs})
	if !errors.Is(err, ErrCorrupt) || res.Outcome != OutcomeCorrupt || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("got %v, outcome %v; want a checksum failure", err, res.Outcome)
	}
	checkLarge(t, res, hs[:37], verify)
	waitPins(t, src)
}

func checkLarge(t *testing.T, res FetchResult, want []uint64, verify func(uint64, []byte) error) {
	t.Helper()
	if res.Completed != len(want) || len(res.Blocks) != len(want) {
		t.Fatalf("completed %d, %d blocks; want %d", res.Completed, len(res.Blocks), len(want))
	}
	for i, b := range res.Blocks {
		if b.Hash != want[i] {
			t.Fatalf("block %d hash %x, want %x", i, b.Hash, want[i])
		}
		if err := verify(b.Hash, b.Payload); err != nil {
			t.Fatalf("block %d: %v", i, err)
		}
	}
}

// TestVerifiedAfterDeadlineIsTimeout: when verifying (here a Verify that
// takes the client's clock past the deadline on the last block) ends after
// the deadline, the fetch is a timeout and delivers nothing, even though
// the source's done arrived in time.
func TestVerifiedAfterDeadlineIsTimeout(t *testing.T) {
	asyncAll = true
	defer func() { asyncAll = false }()
	mem := NewMemSource(testLayers, testLayerSize)
	hs := hashes(41, 6)
	mem.Add(hs...)
	ep := startServer(t, &Server{Source: mem})
	c := newClient(t, ClientOptions{Timeout: 10 * time.Second})
	var skew atomic.Int64
	c.now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	verify := func(h uint64, p []byte) error {
		if h == hs[len(hs)-1] {
			skew.Store(int64(time.Hour))
		}
		return nil
	}
	res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs, Verify: verify})
	if !errors.Is(err, ErrTimeout) || res.Outcome != OutcomeTimeout || res.Success || res.Completed != 0 || res.Blocks != nil {
		t.Fatalf("got %+v, %v; want a timeout with no blocks", res, err)
	}
	waitPins(t, mem)
}
