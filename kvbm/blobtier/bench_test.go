package blobtier

import (
	"context"
	"testing"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/blob/fileblob"
	"gocloud.dev/blob/memblob"

	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/kvbm"
	"github.com/kvmesh/kvmesh/kvbm/blobtier/blobtiertest"
)

// BenchmarkPutGet is the object tier's cost per block: one Put (replacing
// the slot's previous object) and one Get, 64 KiB blocks; s3 is s3blob
// against the in-process S3 server on loopback (the SDK's and HTTP's cost,
// no network's).
//
//	go test ./kvbm/blobtier -run '^$' -bench PutGet -benchmem
func BenchmarkPutGet(b *testing.B) {
	const size, slots = 64 << 10, 64
	for _, drv := range []string{"mem", "file", "s3"} {
		b.Run(drv, func(b *testing.B) {
			ctx := context.Background()
			var bk *blob.Bucket
			var err error
			switch drv {
			case "mem":
				bk = memblob.OpenBucket(nil)
			case "file":
				bk, err = fileblob.OpenBucket(b.TempDir(), nil)
			case "s3":
				srv := blobtiertest.NewS3(b, "kv")
				blobtiertest.SetEnv(b, blobtiertest.AccessKey)
				bk, err = blob.OpenBucket(ctx, srv.URL("kv"))
			}
			if err != nil {
				b.Fatal(err)
			}
			defer bk.Close()
			st, err := New(ctx, bk, "kvbm/w/", slots, size)
			if err != nil {
				b.Fatal(err)
			}
			src, dst := make([]byte, size), make([]byte, size)
			b.SetBytes(2 * size)
			i := 0
			for b.Loop() {
				h := kv.SeqHash(uint64(i)*0x9e3779b97f4a7c15 + 1)
				if err := st.Put(i%slots, src, kvbm.BlockMeta{Seq: h}); err != nil {
					b.Fatal(err)
				}
				if err := st.Get(i%slots, dst); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

// BenchmarkOffloadSlowBucket is one Offload of 4 new blocks of 64 KiB
// through a full 64-block host tier (so 4 evictions to the object tier)
// over a bucket whose puts take 10 ms each: synchronous writes inside the
// call versus the asynchronous writer (64 staged blocks, 4 writers),
// back to back and paced at one call per 12 ms (the timer stopped between
// calls), under the writers' 400 puts/s. dropped/op is the object copies
// the full queue dropped.
//
//	go test ./kvbm/blobtier -run '^$' -bench OffloadSlowBucket -benchtime 100x -count 3
func BenchmarkOffloadSlowBucket(b *testing.B) {
	const size, host, per = 64 << 10, 64, 4
	for _, mode := range []string{"sync", "async", "async-paced"} {
		b.Run(mode, func(b *testing.B) {
			bk, _ := newSlowBucket(10*time.Millisecond, nil)
			defer bk.Close()
			st, err := New(context.Background(), bk, "kvbm/w/", 1<<16, size)
			if err != nil {
				b.Fatal(err)
			}
			var obj kvbm.Storage = st
			var a *Async
			if mode != "sync" {
				if a, err = NewAsync(st, AsyncConfig{Depth: 64, Writers: 4}); err != nil {
					b.Fatal(err)
				}
				defer a.Close()
				obj = a
			}
			h, err := kvbm.NewHostArena(host, size)
			if err != nil {
				b.Fatal(err)
			}
			m, err := kvbm.NewManager(kvbm.Config{BlockSize: 16, BlockBytes: size, Host: h, Object: obj})
			if err != nil {
				b.Fatal(err)
			}
			d := make(benchDev, per)
			for i := range d {
				d[i] = make([]byte, size)
				d[i][0] = byte(i)
			}
			blocks := make([]kvbm.StoreBlock, per)
			next := uint64(1)
			fill := func() {
				for i := range blocks {
					blocks[i] = kvbm.StoreBlock{Device: kvbm.DeviceBlockID(i), Meta: kvbm.BlockMeta{Seq: kv.SeqHash(next * 0x9e3779b97f4a7c15)}}
					next++
				}
			}
			for range host / per {
				fill()
				if _, err := m.Offload(d, blocks); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(per * size)
			for b.Loop() {
				fill()
				if _, err := m.Offload(d, blocks); err != nil {
					b.Fatal(err)
				}
				if mode == "async-paced" {
					b.StopTimer()
					time.Sleep(12 * time.Millisecond)
					m.Settle()
					b.StartTimer()
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(m.Stats().DroppedObject)/float64(b.N), "dropped/op")
		})
	}
}

type benchDev [][]byte

func (d benchDev) ReadView(id kvbm.DeviceBlockID) ([]byte, error)  { return d[id], nil }
func (d benchDev) WriteView(id kvbm.DeviceBlockID) ([]byte, error) { return d[id], nil }
