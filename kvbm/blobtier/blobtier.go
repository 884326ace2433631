// Package blobtier is the KV block manager's object tier (G4) storage: a
// kvbm.Storage over a gocloud.dev/blob bucket, one object per block, named
// by the block's sequence hash under a per-worker prefix, each object the
// block's self-checking header (kvbm.EncodeBlockHeader: identity and
// payload checksum) followed by its bytes. Listing the prefix at start
// recovers the blocks a previous run left (kvbm.Manager.RecoverObject
// verifies them).
//
// Only the file:// and mem:// drivers are registered: s3blob pulls the AWS
// SDK (about 20 modules, twice the binary's dependency packages), so an
// s3:// URL is refused with a message saying so; a build that wants S3
// adds one blank import of gocloud.dev/blob/s3blob here.
//
// It imports kvbm, kv and gocloud.dev/blob; the block manager's core
// (package kvbm) must not import it: engines hand it to kvbm.Config.
package blobtier

import (
	"context"
	"crypto/md5"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob" // file:///dir
	_ "gocloud.dev/blob/memblob"  // mem://

	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/kvbm"
)

// CheckURL validates an object-tier URL without opening it: a scheme this
// build registers and, for file://, an absolute directory.
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
	case "s3", "gs", "azblob":
		return fmt.Errorf("%q: the %s driver is not built in (only file:// and mem://; see package kvbm/blobtier)", raw, u.Scheme)
	}
	return fmt.Errorf("%q: want a file:/// or mem:// URL", raw)
}

// Store is one worker's object tier: slots of a kvbm pool mapped to
// objects. It is not safe for concurrent use.
type Store struct {
	ctx    context.Context
	b      *blob.Bucket
	prefix string
	bb, n  int
	keys   []kv.SeqHash // slot → object; has[slot] says whether it is set
	has    []bool
	hdr    []byte
	owned  bool
}

// Open opens the bucket at rawURL (a file:// directory is created if
// missing) for a tier of slots blocks of blockBytes each, its objects
// under prefix ("kvbm/<worker>/", say).
func Open(ctx context.Context, rawURL, prefix string, slots, blockBytes int) (*Store, error) {
	if err := CheckURL(rawURL); err != nil {
		return nil, fmt.Errorf("kvbm object tier: %w", err)
	}
	if u, _ := url.Parse(rawURL); u.Scheme == "file" && u.Query().Get("create_dir") == "" {
		q := u.Query()
		q.Set("create_dir", "true")
		u.RawQuery = q.Encode()
		rawURL = u.String()
	}
	b, err := blob.OpenBucket(ctx, rawURL)
	if err != nil {
		return nil, fmt.Errorf("kvbm object tier: %w", err)
	}
	s, err := New(ctx, b, prefix, slots, blockBytes)
	if err != nil {
		b.Close()
		return nil, err
	}
	s.owned = true
	return s, nil
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
	if s.has[slot] && s.keys[slot] != m.Seq {
		if err := s.b.Delete(s.ctx, s.Key(s.keys[slot])); err != nil && !isNotFound(err) {
			return fmt.Errorf("kvbm object tier: %w", err)
		}
		s.has[slot] = false
	}
	if err := s.write(s.ctx, s.hdr, src, m, false); err != nil {
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
	r, err := s.b.NewReader(s.ctx, key, nil)
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
// and ones not of this geometry are deleted (the tier is a bounded cache).
func (s *Store) Scan(fn func(slot int, m kvbm.BlockMeta)) error {
	it := s.b.List(&blob.ListOptions{Prefix: s.prefix})
	next := 0
	var errs []error
	for {
		obj, err := it.Next(s.ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("kvbm object tier: list %s: %w", s.prefix, err)
		}
		if obj.IsDir {
			continue
		}
		m, ok := s.header(obj)
		if !ok || next >= s.n {
			if err := s.b.Delete(s.ctx, obj.Key); err != nil && !isNotFound(err) {
				errs = append(errs, err)
			}
			continue
		}
		s.keys[next], s.has[next] = m.Seq, true
		fn(next, m)
		next++
	}
	return errors.Join(errs...)
}

func (s *Store) header(obj *blob.ListObject) (kvbm.BlockMeta, bool) {
	if obj.Size != int64(kvbm.BlockHeaderSize+s.bb) {
		return kvbm.BlockMeta{}, false
	}
	r, err := s.b.NewRangeReader(s.ctx, obj.Key, 0, kvbm.BlockHeaderSize, nil)
	if err != nil {
		return kvbm.BlockMeta{}, false
	}
	defer r.Close()
	if _, err := io.ReadFull(r, s.hdr); err != nil {
		return kvbm.BlockMeta{}, false
	}
	m, ok := kvbm.DecodeBlockHeader(s.hdr, s.bb)
	if !ok || obj.Key != s.Key(m.Seq) {
		return kvbm.BlockMeta{}, false
	}
	return m, true
}

// Close closes the bucket if Open opened it.
func (s *Store) Close() error {
	if !s.owned {
		return nil
	}
	return s.b.Close()
}

func isNotFound(err error) bool {
	return strings.Contains(err.Error(), "NotFound") || errors.Is(err, io.EOF)
}
