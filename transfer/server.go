package transfer

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// Server defaults.
const (
	DefaultMaxConns      = 256
	DefaultMaxActive     = 32
	DefaultMaxOpTimeout  = 5 * time.Second
	DefaultIdleTimeout   = 60 * time.Second
	DefaultMaxBlockBytes = 64 << 20
	// copyBatchBytes is how much the copying path (ReadBlock) stages
	// before one write. Fewer, larger writes are markedly cheaper on
	// loopback (each write ends in a push and a reader wake-up).
	copyBatchBytes = 2 << 20
	// viewBatchBytes and viewBatchBlocks bound one writev of the zero-copy
	// path (BlockViewer): its payloads cost no server memory, only 80
	// bytes of header and iovec per block.
	viewBatchBytes  = 64 << 20
	viewBatchBlocks = 2048
	// maxPooledBuf keeps huge-block buffers out of the pool.
	maxPooledBuf = 4 << 20
)

// Server serves blocks from a BlockSource on a control endpoint. Each
// connection carries one fetch at a time; connections are reused by clients.
type Server struct {
	Source BlockSource
	// Digest is this source's compatibility digest. A request carrying a
	// non-empty digest different from it is refused.
	Digest string
	// MaxConns bounds open connections (pooled ones included); extra
	// connections are refused with CodeBusy.
	MaxConns int
	// MaxActive bounds fetches being served at once, and so the server's
	// staging memory (about 2 MiB each when copying); a fetch waits for a
	// slot until its deadline, then is refused with CodeBusy.
	MaxActive int
	// MaxOpTimeout caps the per-fetch deadline a request may ask for.
	MaxOpTimeout time.Duration
	// IdleTimeout closes a connection that sends no request for this long.
	IdleTimeout time.Duration
	// MaxBlockBytes bounds the block size the source may produce.
	MaxBlockBytes int
	Metrics       *Metrics
	Logger        *slog.Logger
	// Token, when set, is the fleet token: a connection must pass the
	// HMAC handshake (auth.go) before its first fetch is read.
	Token []byte
	// TLS, when set, wraps every connection in TLS before anything is read
	// (set ClientAuth to RequireAndVerifyClientCert for mutual TLS).
	TLS *tls.Config

	warnedPeers
	bufs   sync.Pool
	once   sync.Once
	active chan struct{}
}

// Serve serves src on ln with default settings until ctx ends.
func Serve(ctx context.Context, ln net.Listener, src BlockSource) error {
	return (&Server{Source: src}).Serve(ctx, ln)
}

func (s *Server) defaults() {
	if s.MaxActive <= 0 {
		s.MaxActive = DefaultMaxActive
	}
	s.active = make(chan struct{}, s.MaxActive)
	if s.MaxConns <= 0 {
		s.MaxConns = DefaultMaxConns
	}
	if s.MaxOpTimeout <= 0 {
		s.MaxOpTimeout = DefaultMaxOpTimeout
	}
	if s.IdleTimeout <= 0 {
		s.IdleTimeout = DefaultIdleTimeout
	}
	if s.MaxBlockBytes <= 0 {
		s.MaxBlockBytes = DefaultMaxBlockBytes
	}
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
}

// Serve accepts connections on ln until ctx ends, then closes ln and every
// connection, waits for all handlers and returns nil. It returns an error
// only if accepting fails for a reason other than shutdown. Serve owns ln.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if s.Source == nil {
		ln.Close()
		return errors.New("transfer server: nil BlockSource")
	}
	s.once.Do(s.defaults)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var (
		mu      sync.Mutex
		conns   = make(map[net.Conn]struct{})
		closing bool
		wg      sync.WaitGroup
	)
	stop := context.AfterFunc(ctx, func() {
		ln.Close()
		mu.Lock()
		closing = true
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	defer stop()

	var acceptErr error
	backoff := time.Duration(0)
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded) || isTemporary(err) {
				// e.g. EMFILE: back off instead of spinning.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.Logger.Warn("transfer: accept failed, retrying", "err", err, "backoff", backoff)
				t := time.NewTimer(backoff)
				select {
				case <-ctx.Done():
				case <-t.C:
				}
				t.Stop()
				continue
			}
			acceptErr = fmt.Errorf("transfer server: accept: %w", err)
			break
		}
		backoff = 0
		mu.Lock()
		if closing {
			mu.Unlock()
			c.Close()
			continue
		}
		if len(conns) >= s.MaxConns {
			mu.Unlock()
			// A refuse frame fits in any socket buffer; the short deadline
			// only guards against a pathological peer.
			c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
			c.Write(appendStatus(nil, typeRefuse, 0, status{code: CodeBusy,
				msg: fmt.Sprintf("source at its limit of %d connections", s.MaxConns)}))
			c.Close()
			continue
		}
		conns[c] = struct{}{}
		wg.Add(1)
		mu.Unlock()
		go func() {
			defer wg.Done()
			s.handle(ctx, c)
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
			c.Close()
		}()
	}
	cancel()
	wg.Wait()
	return acceptErr
}

func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// handle serves fetches on one connection until the peer closes it, idles
// out, misbehaves, or the server shuts down.
func (s *Server) handle(ctx context.Context, c net.Conn) {
	if s.TLS != nil {
		if c = s.serverTLS(ctx, c); c == nil {
			return
		}
	}
	br := bufio.NewReaderSize(c, 4096)
	if len(s.Token) > 0 && !s.authenticate(br, c) {
		return
	}
	var hb [headerLen]byte
	var req []byte
	for ctx.Err() == nil {
		c.SetReadDeadline(time.Now().Add(s.IdleTimeout))
		h, err := readHeader(br, &hb)
		if err != nil {
			// EOF, idle timeout, shutdown or a peer that speaks something
			// else: nothing sensible to answer.
			return
		}
		c.SetReadDeadline(time.Time{})
		if h.version != Version {
			s.refuse(c, h.op, CodeUnsupportedVersion,
				fmt.Sprintf("protocol version %d unsupported; this source speaks version %d", h.version, Version))
			return
		}
		if h.typ == typeRelease {
			if !s.serveRelease(c, br, h) {
				return
			}
			continue
		}
		if h.typ != typeFetch {
			s.refuse(c, h.op, CodeBadRequest, fmt.Sprintf("unexpected %s frame; sources accept only fetch and release", h.typ))
			return
		}
		if h.length > maxRequestFrame {
			// Never read (or allocate) a declared absurd size.
			s.refuse(c, h.op, CodeBadRequest,
				fmt.Sprintf("fetch frame of %d bytes exceeds the %d-byte limit", h.length, maxRequestFrame))
			return
		}
		if cap(req) < int(h.length) {
			req = make([]byte, h.length)
		}
		req = req[:h.length]
		c.SetReadDeadline(time.Now().Add(s.IdleTimeout))
		if _, err := io.ReadFull(br, req); err != nil {
			return
		}
		c.SetReadDeadline(time.Time{})
		r, err := decodeFetch(req)
		if err != nil {
			s.refuse(c, h.op, CodeBadRequest, err.Error())
			return
		}
		if !s.serveFetch(ctx, c, h.op, r) {
			return
		}
	}
}

// serveRelease answers one release frame: done{0, true, ok} when the
// source released a pin by that id, done{0, false, not_found} when it held
// none, refuse{bad_request} when the source pins no handoffs (it does not
// implement HandoffReleaser). It reports whether the connection can carry
// another request.
func (s *Server) serveRelease(c net.Conn, br io.Reader, h header) bool {
	if h.length > maxReleaseFrame {
		s.refuse(c, h.op, CodeBadRequest, fmt.Sprintf("release frame of %d bytes exceeds the %d-byte limit", h.length, maxReleaseFrame))
		return false
	}
	var buf [maxReleaseFrame]byte
	p := buf[:h.length]
	c.SetReadDeadline(time.Now().Add(s.IdleTimeout))
	if _, err := io.ReadFull(br, p); err != nil {
		return false
	}
	c.SetReadDeadline(time.Time{})
	id, err := decodeRelease(p)
	if err != nil {
		s.refuse(c, h.op, CodeBadRequest, err.Error())
		return false
	}
	rel, ok := s.Source.(HandoffReleaser)
	if !ok {
		s.refuse(c, h.op, CodeBadRequest, "this source pins no handoffs to release")
		return true
	}
	st := status{success: true, code: CodeOK}
	if !rel.ReleaseHandoff(id) {
		st = status{code: CodeNotFound, msg: "no pinned handoff by that id (read, released or expired)"}
	}
	c.SetWriteDeadline(time.Now().Add(time.Second))
	_, err = c.Write(appendStatus(nil, typeDone, h.op, st))
	c.SetWriteDeadline(time.Time{})
	return err == nil
}

func (s *Server) refuse(c net.Conn, op uint32, code Code, msg string) {
	c.SetWriteDeadline(time.Now().Add(time.Second))
	c.Write(appendStatus(nil, typeRefuse, op, status{code: code, msg: msg}))
}

func (s *Server) getBuf() []byte {
	if b, ok := s.bufs.Get().(*[]byte); ok {
		return (*b)[:0]
	}
	return make([]byte, 0, copyBatchBytes+64<<10)
}

func (s *Server) putBuf(b []byte) {
	if cap(b) <= maxPooledBuf {
		s.bufs.Put(&b)
	}
}

// inDomain is how many of the pinned hashes, from the first, were stored
// in salt domain d (all of them when the source cannot tell domains).
func (s *Server) inDomain(pinned []uint64, d uint64) int {
	dom, ok := s.Source.(BlockDomainer)
	if !ok {
		return len(pinned)
	}
	for i, h := range pinned {
		if got, ok := dom.BlockDomain(h); !ok || got != d {
			s.Metrics.refuse(refusedSaltDomain)
			return i
		}
	}
	return len(pinned)
}

// serveFetch answers one fetch; it reports whether the connection can carry
// another request.
func (s *Server) serveFetch(ctx context.Context, c net.Conn, op uint32, r fetchReq) (keep bool) {
	start := time.Now()
	s.Metrics.begin(scopeServe)
	outcome, sent, sentBytes := OutcomeFailed, 0, int64(0)
	defer func() { s.Metrics.end(scopeServe, outcome, time.Since(start), sent, sentBytes) }()
	var st status
	var err error

	if r.digest != "" && r.digest != s.Digest {
		outcome = OutcomeRefused
		s.refuse(c, op, CodeDigestMismatch,
			fmt.Sprintf("compatibility digest mismatch: request %q, source %q", r.digest, s.Digest))
		return true
	}
	// Deadline = receipt + min(requested, own cap), as in KVCR.
	deadline := start.Add(min(time.Duration(r.timeoutMs)*time.Millisecond, s.MaxOpTimeout))

	// Wait for a serving slot, at most until the deadline.
	select {
	case s.active <- struct{}{}:
		defer func() { <-s.active }()
	default:
		t := time.NewTimer(time.Until(deadline))
		select {
		case s.active <- struct{}{}:
			t.Stop()
			defer func() { <-s.active }()
		case <-t.C:
			outcome = OutcomeRefused
			s.refuse(c, op, CodeBusy, fmt.Sprintf("source serving its limit of %d fetches until the deadline", s.MaxActive))
			return true
		case <-ctx.Done():
			t.Stop()
			outcome = OutcomeCancelled
			s.refuse(c, op, CodeShutdown, "source shutting down")
			return false
		}
	}

	n, release := s.Source.Pin(r.hashes)
	if release != nil {
		defer release()
	}
	if n < 0 || n > len(r.hashes) {
		outcome = OutcomeFailed
		s.writeStatus(c, op, status{code: CodeSourceError, msg: fmt.Sprintf("source pinned %d of %d blocks", n, len(r.hashes))}, deadline)
		return false
	}
	// A block of another salt domain is not this request's to read: the
	// prefix ends before it, as if the source did not hold it.
	n = s.inDomain(r.hashes[:n], r.domain)
	if n == 0 {
		outcome = OutcomeNotFound
		return s.writeStatus(c, op, status{code: CodeNotFound,
			msg: fmt.Sprintf("source holds none of the %d requested blocks (first %016x)", len(r.hashes), r.hashes[0])}, deadline)
	}

	c.SetWriteDeadline(deadline)
	st, sent, sentBytes, err = s.sendBlocks(ctx, c, op, r.hashes[:n], deadline)
	if err != nil {
		outcome = s.writeFailure(err)
		return false
	}
	switch {
	case st.success && n == len(r.hashes):
		outcome = OutcomeSuccess
	case st.success:
		outcome = OutcomePartial
	case st.code == CodeTimeout:
		outcome = OutcomeTimeout
	case st.code == CodeShutdown:
		outcome = OutcomeCancelled
	default:
		outcome = OutcomeFailed
	}
	c.SetWriteDeadline(time.Time{})
	return st.code != CodeTimeout && st.code != CodeShutdown
}

// sendBlocks writes the block frames of the pinned prefix hs and the done
// frame, in large batches: headers and copied payloads share one buffer
// (ReadBlock), or a BlockViewer's payloads go out by writev straight from
// the source's memory.
func (s *Server) sendBlocks(ctx context.Context, c net.Conn, op uint32, hs []uint64, deadline time.Time) (st status, sent int, sentBytes int64, err error) {
	viewer, zeroCopy := s.Source.(BlockViewer)
	summer, stored := s.Source.(BlockChecksummer)
	buf := s.getBuf()
	defer func() { s.putBuf(buf) }()
	var iov, iovStore net.Buffers // WriteTo consumes iov; iovStore keeps the array
	var hdrs []byte               // zero-copy path: frame headers, one slab per batch
	if zeroCopy {
		nb := min(len(hs), viewBatchBlocks)
		iovStore = make(net.Buffers, 0, 2*nb+1)
		iov = iovStore
		hdrs = make([]byte, 0, nb*(headerLen+blockMetaLen)+headerLen+maxStatusFrame)
	}
	pending := 0
	flush := func() error {
		var err error
		if zeroCopy {
			if len(iov) > 0 {
				_, err = iov.WriteTo(c)
			}
			iov, hdrs = iovStore[:0], hdrs[:0]
		} else if len(buf) > 0 {
			_, err = c.Write(buf)
			buf = buf[:0]
		}
		pending = 0
		return err
	}

	blockSize := -1
	var zero [headerLen + blockMetaLen]byte
	st = status{completed: uint32(len(hs)), success: true}
	for i, h := range hs {
		if ctx.Err() != nil {
			st = status{completed: uint32(i), code: CodeShutdown, msg: "source shutting down"}
			break
		}
		if !time.Now().Before(deadline) {
			st = status{completed: uint32(i), code: CodeTimeout,
				msg: fmt.Sprintf("source deadline passed after %d of %d blocks", i, len(hs))}
			break
		}
		var payload []byte
		var rerr error
		off := len(buf)
		if zeroCopy {
			payload, rerr = viewer.ViewBlock(h)
		} else {
			buf = append(buf, zero[:]...)
			buf, rerr = s.Source.ReadBlock(h, buf)
			if rerr == nil && len(buf) < off+len(zero) {
				rerr = errors.New("ReadBlock shrank its buffer")
			} else if rerr == nil {
				payload = buf[off+len(zero):]
			}
		}
		if rerr == nil {
			switch size := len(payload); {
			case size == 0:
				rerr = errors.New("empty payload")
			case size > s.MaxBlockBytes:
				rerr = fmt.Errorf("payload of %d bytes exceeds the %d-byte limit", size, s.MaxBlockBytes)
			case blockSize >= 0 && size != blockSize:
				rerr = fmt.Errorf("payload of %d bytes, earlier blocks had %d", size, blockSize)
			}
		}
		if rerr != nil {
			if !zeroCopy {
				buf = buf[:min(off, len(buf))]
			}
			st = status{completed: uint32(i), code: CodeSourceError,
				msg: fmt.Sprintf("reading block %d (%016x): %v", i, h, rerr)}
			break
		}
		blockSize = len(payload)
		var sum uint64
		ok := false
		if stored {
			sum, ok = summer.BlockChecksum(h)
		}
		if !ok {
			sum = kv.Checksum(payload)
		}
		if zeroCopy {
			ho := len(hdrs)
			hdrs = append(hdrs, zero[:]...)
			putBlockMeta(hdrs[ho:], op, uint32(i), h, sum, len(payload))
			iov = append(iov, hdrs[ho:len(hdrs):len(hdrs)], payload)
		} else {
			putBlockMeta(buf[off:], op, uint32(i), h, sum, len(payload))
		}
		sent++
		sentBytes += int64(len(payload))
		pending += len(zero) + len(payload)
		full := pending >= copyBatchBytes
		if zeroCopy {
			full = pending >= viewBatchBytes || len(iov) >= 2*viewBatchBlocks
		}
		if full {
			if err := flush(); err != nil {
				return st, sent, sentBytes, err
			}
		}
	}
	if zeroCopy {
		ho := len(hdrs)
		hdrs = appendStatus(hdrs, typeDone, op, st)
		iov = append(iov, hdrs[ho:])
	} else {
		buf = appendStatus(buf, typeDone, op, st)
	}
	if err := flush(); err != nil {
		return st, sent, sentBytes, err
	}
	return st, sent, sentBytes, nil
}

func (s *Server) writeFailure(err error) Outcome {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return OutcomeTimeout
	}
	return OutcomeFailed
}

func (s *Server) writeStatus(c net.Conn, op uint32, st status, deadline time.Time) bool {
	c.SetWriteDeadline(deadline)
	_, err := c.Write(appendStatus(nil, typeDone, op, st))
	c.SetWriteDeadline(time.Time{})
	return err == nil
}
