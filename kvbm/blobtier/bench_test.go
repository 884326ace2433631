package blobtier

import (
	"context"
	"testing"

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
