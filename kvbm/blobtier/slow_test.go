package blobtier

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/blob/driver"
	"gocloud.dev/blob/memblob"
	"gocloud.dev/gcerrors"
)

// slowBucket is a blob driver over a real mem:// bucket whose puts take
// delay each (an object store's round trip) and, with gate set, wait for
// a value on it first: a test holds writes in flight as long as it likes.
type slowBucket struct {
	b     *blob.Bucket
	delay time.Duration
	gate  chan struct{}
	puts  atomic.Int64 // completed puts
	// delDelay is each delete's round trip.
	delDelay time.Duration
}

// newSlowBucket returns the portable bucket over a slow mem:// bucket.
func newSlowBucket(delay time.Duration, gate chan struct{}) (*blob.Bucket, *slowBucket) {
	s := &slowBucket{b: memblob.OpenBucket(nil), delay: delay, gate: gate}
	return blob.NewBucket(s), s
}

func (s *slowBucket) ErrorCode(err error) gcerrors.ErrorCode { return gcerrors.Code(err) }
func (s *slowBucket) As(any) bool                            { return false }
func (s *slowBucket) ErrorAs(error, any) bool                { return false }
func (s *slowBucket) Close() error                           { return s.b.Close() }

func (s *slowBucket) Attributes(ctx context.Context, key string) (*driver.Attributes, error) {
	a, err := s.b.Attributes(ctx, key)
	if err != nil {
		return nil, err
	}
	return &driver.Attributes{ContentType: a.ContentType, ModTime: a.ModTime, Size: a.Size, MD5: a.MD5}, nil
}

func (s *slowBucket) ListPaged(ctx context.Context, o *driver.ListOptions) (*driver.ListPage, error) {
	objs, next, err := s.b.ListPage(ctx, o.PageToken, max(o.PageSize, 1000), &blob.ListOptions{Prefix: o.Prefix, Delimiter: o.Delimiter})
	if err != nil {
		return nil, err
	}
	p := &driver.ListPage{NextPageToken: next}
	for _, x := range objs {
		p.Objects = append(p.Objects, &driver.ListObject{Key: x.Key, ModTime: x.ModTime, Size: x.Size, MD5: x.MD5, IsDir: x.IsDir})
	}
	return p, nil
}

type slowReader struct{ *blob.Reader }

func (r slowReader) Attributes() *driver.ReaderAttributes {
	return &driver.ReaderAttributes{ContentType: r.ContentType(), ModTime: r.ModTime(), Size: r.Size()}
}
func (r slowReader) As(any) bool { return false }

func (s *slowBucket) NewRangeReader(ctx context.Context, key string, off, n int64, _ *driver.ReaderOptions) (driver.Reader, error) {
	r, err := s.b.NewRangeReader(ctx, key, off, n, nil)
	if err != nil {
		return nil, err
	}
	return slowReader{r}, nil
}

type slowWriter struct {
	s      *slowBucket
	ctx    context.Context
	w      *blob.Writer
	cancel context.CancelFunc // the inner writer's: a cancelled put never appears
}

func (w *slowWriter) Write(p []byte) (int, error) { return w.w.Write(p) }

// Close is the put's round trip: the object appears after it, or not at
// all when the context ends first.
func (w *slowWriter) Close() error {
	defer w.cancel()
	fail := func(err error) error {
		w.cancel()
		_ = w.w.Close()
		return err
	}
	if w.s.gate != nil {
		select {
		case <-w.s.gate:
		case <-w.ctx.Done():
			return fail(w.ctx.Err())
		}
	}
	t := time.NewTimer(w.s.delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-w.ctx.Done():
		return fail(w.ctx.Err())
	}
	if err := w.w.Close(); err != nil {
		return err
	}
	w.s.puts.Add(1)
	return nil
}

func (s *slowBucket) NewTypedWriter(ctx context.Context, key, contentType string, _ *driver.WriterOptions) (driver.Writer, error) {
	ictx, cancel := context.WithCancel(context.Background())
	w, err := s.b.NewWriter(ictx, key, &blob.WriterOptions{ContentType: contentType})
	if err != nil {
		cancel()
		return nil, err
	}
	return &slowWriter{s: s, ctx: ctx, w: w, cancel: cancel}, nil
}

func (s *slowBucket) Copy(ctx context.Context, dst, src string, _ *driver.CopyOptions) error {
	return s.b.Copy(ctx, dst, src, nil)
}

func (s *slowBucket) Delete(ctx context.Context, key string, _ *driver.DeleteOptions) error {
	if s.delDelay > 0 {
		t := time.NewTimer(s.delDelay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.b.Delete(ctx, key)
}

func (s *slowBucket) SignedURL(context.Context, string, *driver.SignedURLOptions) (string, error) {
	return "", errors.New("slow bucket: no signed URLs")
}
