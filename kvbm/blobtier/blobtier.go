// Package blobtier is the KV block manager's object tier (G4) storage: a
// kvbm.Storage over a gocloud.dev/blob bucket, one object per block, named
// by the block's sequence hash under a per-worker prefix, each object the
// block's self-checking header (kvbm.EncodeBlockHeader: identity and
// payload checksum) followed by its bytes. Listing the prefix at start
// recovers the blocks a previous run left (kvbm.Manager.RecoverObject
// verifies them).
//
// Drivers: file:// and mem://, and s3:// (gocloud.dev/blob/s3blob over the
// AWS SDK v2: any S3-compatible service by the URL's endpoint=, region=
// and use_path_style= parameters, credentials from the AWS standard chain
// of environment, shared config files and instance roles). gs:// is
// refused: gcsblob's Google Cloud client weighs more than twice the AWS
// SDK in the binary (docs/benchmarks.md); GCS's S3-compatible XML API is
// reachable through s3:// instead.
//
// A remote bucket is probed at start (Probe, bounded in time) and every
// operation on it carries a timeout, so a stalled endpoint fails a block,
// never the engine.
//
// It imports kvbm, kv and gocloud.dev/blob; the block manager's core
// (package kvbm) must not import it: engines hand it to kvbm.Config.
package blobtier

import (
	"context"
	"crypto/md5"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob" // file:///dir
	_ "gocloud.dev/blob/memblob"  // mem://
	_ "gocloud.dev/blob/s3blob"   // s3://bucket (issue 13 asks for S3-compatible object stores)
	"gocloud.dev/gcerrors"

	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/kvbm"
)

const (
	// ProbeTimeout bounds Probe when its context has no deadline.
	ProbeTimeout = 10 * time.Second
	// OpTimeout bounds each call to a remote bucket (one object's put,
	// get or delete, one listing page).
	OpTimeout = 30 * time.Second
)

// CheckURL validates an object-tier URL without opening it: a scheme this
// build registers and, for file://, an absolute directory; for s3://, a
// bucket name (a path after it is a key prefix). The query's parameters
// are the driver's; Probe (or Open) reports those it does not know.
func CheckURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	switch u.Scheme {
	case "mem":
		return nil
	case "file":
		if u.Host != "" || !strings.HasPrefix(u.Path, "/") {
			return fmt.Errorf("%q: want file:///absolute/dir", raw)
		}
		return nil
	case "s3":
		if u.Host == "" {
			return fmt.Errorf("%q: want s3://bucket[/prefix][?region=…&endpoint=…&use_path_style=true]", raw)
		}
		return nil
	case "gs":
		return fmt.Errorf("%q: gs:// is not built in (the Google Cloud Storage client would grow the binary by 40%%); GCS speaks S3 with HMAC keys: s3://bucket?endpoint=https://storage.googleapis.com&region=auto&request_checksum_calculation=when_required&response_checksum_validation=when_required", raw)
	case "azblob":
		return fmt.Errorf("%q: the azblob driver is not built in (only file://, mem:// and s3://)", raw)
	}
	return fmt.Errorf("%q: want a file:///, mem:// or s3:// URL", raw)
}

// Remote says whether raw names a bucket across the network: its calls
// get timeouts, and a command probes it at start.
func Remote(raw string) bool {
	u, err := url.Parse(raw)
	return err == nil && u.Scheme != "file" && u.Scheme != "mem"
}

// openBucket opens raw's bucket: a file:// directory is created if
// missing; an s3:// URL's path becomes a key prefix, returned.
func openBucket(ctx context.Context, raw string) (*blob.Bucket, string, error) {
	if err := CheckURL(raw); err != nil {
		return nil, "", err
	}
	u, _ := url.Parse(raw)
	var keyPrefix string
	switch u.Scheme {
	case "file":
		if u.Query().Get("create_dir") == "" {
			q := u.Query()
			q.Set("create_dir", "true")
			u.RawQuery = q.Encode()
		}
	case "s3":
		if p := strings.Trim(u.Path, "/"); p != "" {
			keyPrefix = p + "/"
		}
		u.Path, u.RawPath = "", ""
	}
	b, err := blob.OpenBucket(ctx, u.String())
	if err != nil {
		return nil, "", err
	}
	return b, keyPrefix, nil
}

// Probe opens the bucket at rawURL and checks that this process can list
// it and write and delete an object in it (a read-only credential fails
// here, not at the first offload). It gives up at ctx's deadline, or
// after ProbeTimeout when ctx has none; its error says what is wrong
// (no such bucket, access denied, no answer) in words.
func Probe(ctx context.Context, rawURL string) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, ProbeTimeout)
		defer cancel()
	}
	b, prefix, err := openBucket(ctx, rawURL)
	if err != nil {
		return err
	}
	defer b.Close()
	name := bucketName(rawURL)
	ok, err := b.IsAccessible(ctx)
	if err != nil {
		return explain(ctx, name, "list", err)
	}
	if !ok {
		return fmt.Errorf("bucket %s does not exist (create it first; kvmesh does not create buckets)", name)
	}
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	key := prefix + "kvbm/.probe-" + hex.EncodeToString(nonce[:])
	if err := b.WriteAll(ctx, key, []byte("kvmesh object tier probe\n"), nil); err != nil {
		return explain(ctx, name, "write to", err)
	}
	if err := b.Delete(ctx, key); err != nil {
		return explain(ctx, name, "delete from", err)
	}
	return nil
}

func bucketName(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return fmt.Sprintf("%q", raw)
	}
	return fmt.Sprintf("%q", u.Host)
}

// explain turns a driver's error into one that says what to fix.
func explain(ctx context.Context, bucket, op string, err error) error {
	var hs interface{ HTTPStatusCode() int }
	status := 0
	if errors.As(err, &hs) {
		status = hs.HTTPStatusCode()
	}
	var ne *net.OpError
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("cannot %s bucket %s: no answer in time (%v): is the endpoint reachable? %w", op, bucket, ctx.Err(), err)
	case errors.As(err, &ne):
		return fmt.Errorf("cannot %s bucket %s: cannot reach its endpoint: %w", op, bucket, err)
	case gcerrors.Code(err) == gcerrors.NotFound:
		return fmt.Errorf("cannot %s bucket %s: it does not exist: %w", op, bucket, err)
	case gcerrors.Code(err) == gcerrors.PermissionDenied || status == 401 || status == 403:
		return fmt.Errorf("cannot %s bucket %s: access denied: check the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws, the instance role) and the bucket's policy: %w", op, bucket, err)
	case strings.Contains(err.Error(), "credentials"):
		return fmt.Errorf("cannot %s bucket %s: no usable credentials (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, or add anonymous=true for a public bucket): %w", op, bucket, err)
	}
	return fmt.Errorf("cannot %s bucket %s: %w", op, bucket, err)
}

// Store is one worker's object tier: slots of a kvbm pool mapped to
// objects. It is not safe for concurrent use.
type Store struct {
	ctx     context.Context
	b       *blob.Bucket
	prefix  string
	bb, n   int
	keys    []kv.SeqHash // slot → object; has[slot] says whether it is set
	has     []bool
	hdr     []byte
	owned   bool
	timeout time.Duration // per call; 0: none (local buckets)
}

// Open opens the bucket at rawURL (a file:// directory is created if
// missing; an s3:// URL's path is a key prefix before prefix) for a tier
// of slots blocks of blockBytes each, its objects under prefix
// ("kvbm/<worker>/", say). A remote bucket's calls time out after
// OpTimeout each.
func Open(ctx context.Context, rawURL, prefix string, slots, blockBytes int) (*Store, error) {
	b, keyPrefix, err := openBucket(ctx, rawURL)
	if err != nil {
		return nil, fmt.Errorf("kvbm object tier: %w", err)
	}
	s, err := New(ctx, b, keyPrefix+prefix, slots, blockBytes)
	if err != nil {
		b.Close()
		return nil, err
	}
	s.owned = true
	if Remote(rawURL) {
		s.timeout = OpTimeout
	}
	return s, nil
}

// Tier is an object tier its opener owns: a Store, or an Async over one.
type Tier interface {
	kvbm.Storage
	Close() error
}

// TierDrain is how long closing an OpenTier's Async waits for its queued
// writes before it cancels them (they cost a recompute, not correctness).
const TierDrain = 2 * time.Second

// OpenTier is Open, with the writes behind an Async of queue blocks when
// queue > 0 (0: synchronous writes, the twin's deterministic mode).
func OpenTier(ctx context.Context, rawURL, prefix string, slots, blockBytes, queue int) (Tier, error) {
	if queue < 0 {
		return nil, fmt.Errorf("kvbm object tier: a queue of %d blocks, want ≥ 0", queue)
	}
	s, err := Open(ctx, rawURL, prefix, slots, blockBytes)
	switch {
	case err != nil:
		return nil, err
	case queue == 0:
		return s, nil
	}
	a, err := NewAsync(s, AsyncConfig{Depth: queue, Drain: TierDrain})
	if err != nil {
		s.Close()
		return nil, err
	}
	return a, nil
}

// New is a Store over an open bucket (Close leaves the bucket open).
func New(ctx context.Context, b *blob.Bucket, prefix string, slots, blockBytes int) (*Store, error) {
	if slots <= 0 || blockBytes <= 0 {
		return nil, fmt.Errorf("kvbm object tier: %d slots × %d bytes", slots, blockBytes)
	}
	return &Store{ctx: ctx, b: b, prefix: prefix, bb: blockBytes, n: slots,
		keys: make([]kv.SeqHash, slots), has: make([]bool, slots), hdr: make([]byte, kvbm.BlockHeaderSize)}, nil
}

func (s *Store) Slots() int      { return s.n }
func (s *Store) BlockBytes() int { return s.bb }

// Key is the object name of block h.
func (s *Store) Key(h kv.SeqHash) string { return fmt.Sprintf("%s%016x", s.prefix, uint64(h)) }

// op is the context of one call to the bucket.
func (s *Store) op() (context.Context, context.CancelFunc) {
	if s.timeout == 0 {
		return s.ctx, func() {}
	}
	return context.WithTimeout(s.ctx, s.timeout)
}

func (s *Store) check(slot, n int) error {
	if slot < 0 || slot >= s.n {
		return fmt.Errorf("kvbm object tier: slot %d out of range [0, %d)", slot, s.n)
	}
	if n != s.bb {
		return fmt.Errorf("kvbm object tier: buffer of %d bytes for a %d-byte block", n, s.bb)
	}
	return nil
}

// Put writes block m as one object (the driver makes it appear whole or
// not at all); the block the slot held before, if another, is deleted.
func (s *Store) Put(slot int, src []byte, m kvbm.BlockMeta) error {
	if err := s.check(slot, len(src)); err != nil {
		return err
	}
	ctx, cancel := s.op()
	defer cancel()
	if s.has[slot] && s.keys[slot] != m.Seq {
		if err := s.b.Delete(ctx, s.Key(s.keys[slot])); err != nil && !isNotFound(err) {
			return fmt.Errorf("kvbm object tier: %w", err)
		}
		s.has[slot] = false
	}
	if err := s.write(ctx, s.hdr, src, m, false); err != nil {
		return err
	}
	s.keys[slot], s.has[slot] = m.Seq, true
	return nil
}

// write puts block m (header encoded into hdr, then src) as one object.
// With verify the object's MD5 goes with it: the bucket (S3 checks
// Content-MD5 on its side) refuses the put if what it received differs.
func (s *Store) write(ctx context.Context, hdr, src []byte, m kvbm.BlockMeta, verify bool) error {
	kvbm.EncodeBlockHeader(hdr, m, s.bb)
	var sum []byte
	if verify {
		h := md5.New()
		h.Write(hdr)
		h.Write(src)
		sum = h.Sum(nil)
	}
	w, err := s.b.NewWriter(ctx, s.Key(m.Seq), &blob.WriterOptions{ContentType: "application/octet-stream",
		BufferSize: len(hdr) + len(src), ContentMD5: sum})
	if err != nil {
		return fmt.Errorf("kvbm object tier: %w", err)
	}
	_, err = w.Write(hdr)
	if err == nil {
		_, err = w.Write(src)
	}
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("kvbm object tier: put %s: %w", s.Key(m.Seq), err)
	}
	return nil
}

// Get reads slot's block bytes into dst (its header checked: the object
// must still be the block the slot was given).
func (s *Store) Get(slot int, dst []byte) error {
	if err := s.check(slot, len(dst)); err != nil {
		return err
	}
	if !s.has[slot] {
		return fmt.Errorf("kvbm object tier: slot %d holds no object", slot)
	}
	key := s.Key(s.keys[slot])
	ctx, cancel := s.op()
	defer cancel()
	r, err := s.b.NewReader(ctx, key, nil)
	if err != nil {
		return fmt.Errorf("kvbm object tier: %w", err)
	}
	defer r.Close()
	if r.Size() != int64(kvbm.BlockHeaderSize+s.bb) {
		return fmt.Errorf("kvbm object tier: %s is %d bytes, want %d", key, r.Size(), kvbm.BlockHeaderSize+s.bb)
	}
	if _, err := io.ReadFull(r, s.hdr); err != nil {
		return fmt.Errorf("kvbm object tier: %s: %w", key, err)
	}
	if m, ok := kvbm.DecodeBlockHeader(s.hdr, s.bb); !ok || m.Seq != s.keys[slot] {
		return fmt.Errorf("kvbm object tier: %s: bad block header", key)
	}
	if _, err := io.ReadFull(r, dst); err != nil {
		return fmt.Errorf("kvbm object tier: %s: %w", key, err)
	}
	return nil
}

// Scan lists the prefix and reports every object whose header is intact,
// giving each a slot in listing order; objects past the tier's capacity
// and ones not of this geometry are deleted (the tier is a bounded cache);
// one whose header cannot be read now is left alone.
func (s *Store) Scan(fn func(slot int, m kvbm.BlockMeta)) error {
	it := s.b.List(&blob.ListOptions{Prefix: s.prefix})
	next := 0
	var errs []error
	for {
		ctx, cancel := s.op()
		obj, err := it.Next(ctx)
		cancel()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("kvbm object tier: list %s: %w", s.prefix, err)
		}
		if obj.IsDir {
			continue
		}
		m, ok, rerr := s.header(obj)
		if rerr != nil {
			continue // unreadable now (a remote hiccup): left for the next start
		}
		if !ok || next >= s.n {
			ctx, cancel := s.op()
			if err := s.b.Delete(ctx, obj.Key); err != nil && !isNotFound(err) {
				errs = append(errs, err)
			}
			cancel()
			continue
		}
		s.keys[next], s.has[next] = m.Seq, true
		fn(next, m)
		next++
	}
	return errors.Join(errs...)
}

// header reads obj's block header: ok says it is a block of this tier's
// geometry under its own name; err, that it could not be read.
func (s *Store) header(obj *blob.ListObject) (m kvbm.BlockMeta, ok bool, err error) {
	if obj.Size != int64(kvbm.BlockHeaderSize+s.bb) {
		return kvbm.BlockMeta{}, false, nil
	}
	ctx, cancel := s.op()
	defer cancel()
	r, err := s.b.NewRangeReader(ctx, obj.Key, 0, kvbm.BlockHeaderSize, nil)
	if err != nil {
		return kvbm.BlockMeta{}, false, err
	}
	defer r.Close()
	if _, err := io.ReadFull(r, s.hdr); err != nil {
		return kvbm.BlockMeta{}, false, err
	}
	m, ok = kvbm.DecodeBlockHeader(s.hdr, s.bb)
	if !ok || obj.Key != s.Key(m.Seq) {
		return kvbm.BlockMeta{}, false, nil
	}
	return m, true, nil
}

// Close closes the bucket if Open opened it.
func (s *Store) Close() error {
	if !s.owned {
		return nil
	}
	return s.b.Close()
}

func isNotFound(err error) bool { return gcerrors.Code(err) == gcerrors.NotFound }
