package transfer

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
)

// storedSource holds ready payloads and copies them out, like an engine
// reading its KV store; MemSource would regenerate bytes on every read and
// measure kv.FillPayload instead of the transfer.
type storedSource struct {
	blocks map[uint64][]byte
	sums   map[uint64]uint64
}

func (s *storedSource) BlockChecksum(h uint64) (uint64, bool) {
	sum, ok := s.sums[h]
	return sum, ok
}

func newStoredSource(hs []uint64, layers, layerSize int) *storedSource {
	s := &storedSource{blocks: make(map[uint64][]byte, len(hs)), sums: make(map[uint64]uint64, len(hs))}
	for _, h := range hs {
		b := make([]byte, layers*layerSize)
		for l := 0; l < layers; l++ {
			kv.FillPayload(b[l*layerSize:(l+1)*layerSize], kv.SeqHash(h), l)
		}
		s.blocks[h] = b
		s.sums[h] = kv.Checksum(b)
	}
	return s
}

func (s *storedSource) Pin(hs []uint64) (int, func()) {
	n := 0
	for _, h := range hs {
		if _, ok := s.blocks[h]; !ok {
			break
		}
		n++
	}
	return n, func() {}
}

func (s *storedSource) ReadBlock(h uint64, dst []byte) ([]byte, error) {
	b, ok := s.blocks[h]
	if !ok {
		return dst, fmt.Errorf("block %x not held", h)
	}
	return append(dst, b...), nil
}

func BenchmarkTransferVsRaw(b *testing.B) {
	for _, sz := range []struct{ blocks, layers, layerSize int }{
		{256, 4, 16 << 10}, // 256 × 64 KiB = 16 MiB
		{64, 4, 256 << 10}, // 64 × 1 MiB = 64 MiB
	} {
		for _, mode := range []string{"copy/alloc", "copy/release", "copy/recvbuf", "view/alloc", "view/release", "view/recvbuf"} {
			name := fmt.Sprintf("%dx%dKiB/%s", sz.blocks, sz.layers*sz.layerSize>>10, mode)
			b.Run(name, func(b *testing.B) {
				view, recv, _ := strings.Cut(mode, "/")
				benchVsRaw(b, sz.blocks, sz.layers, sz.layerSize, view == "view", recv)
			})
		}
	}
}

func benchVsRaw(b *testing.B, blocks, layers, layerSize int, view bool, recv string) {
	blockBytes := layers * layerSize
	total := blocks * blockBytes
	hs := hashes(1000, blocks)
	var src BlockSource = newStoredSource(hs, layers, layerSize)
	if view {
		src = viewSource{src.(*storedSource)}
	}
	ep := startServer(b, &Server{Source: src})
	c := newClient(b, ClientOptions{Timeout: 30 * time.Second, MaxBlockBytes: blockBytes})
	ctx := context.Background()
	req := FetchRequest{Hashes: hs}
	if recv == "recvbuf" {
		req.Buffer = make([]byte, blocks*(headerLen+blockMetaLen+blockBytes)+headerLen+maxStatusFrame)
	}
	testutil.BenchVsRawTCP(b, total, func() {
		res, err := c.Fetch(ctx, ep, req)
		if err != nil || res.Bytes != int64(total) {
			b.Fatalf("fetch: %v (%d bytes)", err, res.Bytes)
		}
		if recv == "release" {
			res.Release()
		}
	})
}

// BenchmarkFetchSmall measures per-fetch overhead (4 blocks × 4 KiB) with a
// pooled connection against a fresh connection per fetch.
func BenchmarkFetchSmall(b *testing.B) {
	for _, pooled := range []bool{true, false} {
		name := "pooled"
		idle := 0
		if !pooled {
			name, idle = "dial_per_fetch", -1
		}
		b.Run(name, func(b *testing.B) {
			hs := hashes(2000, 4)
			ep := startServer(b, &Server{Source: newStoredSource(hs, 1, 4<<10)})
			c := newClient(b, ClientOptions{MaxIdlePerEndpoint: idle})
			ctx := context.Background()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.Fetch(ctx, ep, FetchRequest{Hashes: hs}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkVerify is the cost of the optional byte-for-byte Verify on top
// of the checksum, per 64 KiB block.
func BenchmarkVerify(b *testing.B) {
	const layers, layerSize = 4, 16 << 10
	p := newStoredSource([]uint64{7}, layers, layerSize).blocks[7]
	v := PayloadVerifier(layers, layerSize)
	b.SetBytes(int64(len(p)))
	b.Run("checksum", func(b *testing.B) {
		b.SetBytes(int64(len(p)))
		for i := 0; i < b.N; i++ {
			kv.Checksum(p)
		}
	})
	b.Run("payload", func(b *testing.B) {
		b.SetBytes(int64(len(p)))
		for i := 0; i < b.N; i++ {
			if err := v(7, p); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// viewSource serves the same stored payloads without copying (BlockViewer).
type viewSource struct{ *storedSource }

func (s viewSource) ViewBlock(h uint64) ([]byte, error) {
	b, ok := s.blocks[h]
	if !ok {
		return nil, fmt.Errorf("block %x not held", h)
	}
	return b, nil
}
