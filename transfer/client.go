package transfer

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// DefaultTimeout is the per-fetch operation timeout (KVCR's
// operation_timeout_ms default).
const DefaultTimeout = time.Second

// Outcome classifies a transfer, for results and the metrics' result label.
type Outcome uint8

const (
	OutcomeSuccess     Outcome = iota // every requested block delivered and verified
	OutcomePartial                    // the source's whole (shorter) contiguous prefix delivered
	OutcomeNotFound                   // the source holds none of the blocks
	OutcomeRefused                    // the source refused the request (digest, version, busy, bad request)
	OutcomeCorrupt                    // a block failed verification; the prefix ends before it
	OutcomeTimeout                    // the deadline passed first
	OutcomeCancelled                  // the caller's context ended
	OutcomeUnreachable                // no connection to the source
	OutcomeFailed                     // protocol, I/O or source errors
)

var outcomeNames = [...]string{"success", "partial", "not_found", "refused", "corrupt", "timeout", "cancelled", "unreachable", "failed"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return "unknown"
}

// Errors a Fetch may wrap.
var (
	ErrTimeout     = errors.New("transfer deadline exceeded")
	ErrUnreachable = errors.New("source unreachable")
	ErrCorrupt     = errors.New("block failed verification")
	ErrProtocol    = errors.New("transfer protocol violation")
)

// RemoteError is a reason the source gave (refuse, or done without success).
type RemoteError struct {
	Code    Code
	Message string
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("source: %s: %s", e.Code, e.Message)
}

// FetchRequest asks a source for blocks.
type FetchRequest struct {
	// Hashes are sequence hashes in the engine's hash domain, in request
	// order; the source sends the longest contiguous prefix it holds.
	Hashes []uint64
	// Digest, when set, must equal the source's compatibility digest.
	Digest string
	// Timeout overrides the client's operation timeout.
	Timeout time.Duration
	// Verify, when set, checks each block's bytes after its checksum (e.g.
	// PayloadVerifier); an error ends the usable prefix at that block.
	Verify func(hash uint64, payload []byte) error
}

// Block is one delivered block.
type Block struct {
	Hash     uint64
	Checksum uint64 // kv.Checksum of Payload, as the source computed it
	Payload  []byte // every layer concatenated
}

// FetchResult is what a fetch delivered. Blocks are always a verified
// contiguous prefix of the request; Completed == len(Blocks).
type FetchResult struct {
	Blocks    []Block
	Completed int
	// Success: the source delivered its whole available prefix in time and
	// every block verified (a shorter prefix than requested is still a
	// success; see Outcome).
	Success  bool
	Bytes    int64 // payload bytes in Blocks
	Outcome  Outcome
	Duration time.Duration
}

// ClientOptions configure a Client; zero values take defaults.
type ClientOptions struct {
	Timeout time.Duration // default DefaultTimeout
	// MaxBlockBytes bounds a block frame the client will accept (and so
	// allocate); default DefaultMaxBlockBytes.
	MaxBlockBytes int
	// MaxIdlePerEndpoint connections are kept for reuse per endpoint
	// (default 4); negative disables pooling (one connection per fetch).
	MaxIdlePerEndpoint int
	Metrics            *Metrics
}

// Client fetches blocks from control endpoints. It is safe for concurrent
// use; each fetch in flight uses its own connection.
type Client struct {
	opts   ClientOptions
	dialer net.Dialer
	now    func() time.Time // tests move time
	seq    atomic.Uint32

	mu     sync.Mutex
	idle   map[string][]*conn
	closed bool
}

type conn struct {
	net.Conn
	br   *bufio.Reader
	wbuf []byte
}

// NewClient returns a client.
func NewClient(o ClientOptions) *Client {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxBlockBytes <= 0 {
		o.MaxBlockBytes = DefaultMaxBlockBytes
	}
	if o.MaxIdlePerEndpoint == 0 {
		o.MaxIdlePerEndpoint = 4
	}
	return &Client{opts: o, now: time.Now, idle: make(map[string][]*conn)}
}

// Close closes pooled connections; fetches in flight finish, and their
// connections are closed instead of pooled.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for k, cs := range c.idle {
		for _, pc := range cs {
			pc.Close()
		}
		delete(c.idle, k)
	}
	return nil
}

func (c *Client) get(addr string) *conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	cs := c.idle[addr]
	if len(cs) == 0 {
		return nil
	}
	pc := cs[len(cs)-1]
	c.idle[addr] = cs[:len(cs)-1]
	return pc
}

func (c *Client) put(addr string, pc *conn) {
	pc.SetDeadline(time.Time{})
	c.mu.Lock()
	if !c.closed && len(c.idle[addr]) < c.opts.MaxIdlePerEndpoint {
		c.idle[addr] = append(c.idle[addr], pc)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	pc.Close()
}

// Fetch pulls the longest contiguous available prefix of req.Hashes from
// the source at endpoint (tcp://host:port). It returns an error whenever
// the result is not Success; the result still carries any usable verified
// prefix (a corrupt block or a broken connection cuts it; a deadline or a
// cancellation voids it, even if the source's done arrives after).
func (c *Client) Fetch(ctx context.Context, endpoint string, req FetchRequest) (FetchResult, error) {
	start := c.now()
	if len(req.Hashes) == 0 {
		return FetchResult{Outcome: OutcomeFailed}, errors.New("fetch: no block hashes")
	}
	if len(req.Hashes) > MaxHashes {
		return FetchResult{Outcome: OutcomeFailed}, fmt.Errorf("fetch: %d block hashes exceed the limit of %d", len(req.Hashes), MaxHashes)
	}
	if len(req.Digest) > MaxDigestLen {
		return FetchResult{Outcome: OutcomeFailed}, fmt.Errorf("fetch: digest of %d bytes exceeds %d", len(req.Digest), MaxDigestLen)
	}
	ep, err := ParseEndpoint(endpoint)
	if err != nil {
		return FetchResult{Outcome: OutcomeFailed}, fmt.Errorf("fetch: %w", err)
	}
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = c.opts.Timeout
	}
	deadline := start.Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}

	c.opts.Metrics.begin(scopeFetch)
	res, err := c.fetch(ctx, ep.Addr(), req, deadline)
	res.Duration = c.now().Sub(start)
	res.Completed = len(res.Blocks)
	res.Bytes = 0
	for _, b := range res.Blocks {
		res.Bytes += int64(len(b.Payload))
	}
	c.opts.Metrics.end(scopeFetch, res.Outcome, res.Duration, res.Completed, res.Bytes)
	if err != nil {
		err = fmt.Errorf("fetch %d blocks from %s: %w", len(req.Hashes), endpoint, err)
	}
	return res, err
}

func (c *Client) fetch(ctx context.Context, addr string, req FetchRequest, deadline time.Time) (FetchResult, error) {
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return FetchResult{Outcome: OutcomeCancelled}, err
		}
		pc := c.get(addr)
		reused := pc != nil
		if pc == nil {
			var err error
			pc, err = c.dial(ctx, addr, deadline)
			if err != nil {
				return c.dialFailure(ctx, err, deadline)
			}
		}
		res, retry, err := c.exchange(ctx, pc, req, deadline)
		if retry && reused && attempt == 0 {
			// A pooled connection the source closed while idle: the
			// request never reached a handler, so one fresh try is safe.
			continue
		}
		var ok errReusable
		switch {
		case err == nil:
			c.put(addr, pc)
		case errors.As(err, &ok):
			c.put(addr, pc)
			err = ok.error
		default:
			pc.Close()
		}
		return res, err
	}
}

func (c *Client) dial(ctx context.Context, addr string, deadline time.Time) (*conn, error) {
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	nc, err := c.dialer.DialContext(dctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	return &conn{Conn: nc, br: bufio.NewReaderSize(nc, 256<<10)}, nil
}

func (c *Client) dialFailure(ctx context.Context, err error, deadline time.Time) (FetchResult, error) {
	switch {
	case ctx.Err() != nil:
		return FetchResult{Outcome: OutcomeCancelled}, fmt.Errorf("dial: %w", ctx.Err())
	case !c.now().Before(deadline) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
		return FetchResult{Outcome: OutcomeTimeout}, fmt.Errorf("%w: dial: %v", ErrTimeout, err)
	}
	return FetchResult{Outcome: OutcomeUnreachable}, fmt.Errorf("%w: %v", ErrUnreachable, err)
}

// aLongTimeAgo unblocks every pending read and write on a connection.
var aLongTimeAgo = time.Unix(1, 0)

// exchange runs one fetch on pc. retry reports a stale pooled connection
// (closed by the peer before any response byte); err == nil means the
// connection ended cleanly and may be reused.
func (c *Client) exchange(ctx context.Context, pc *conn, req FetchRequest, deadline time.Time) (res FetchResult, retry bool, err error) {
	stop := context.AfterFunc(ctx, func() { pc.SetDeadline(aLongTimeAgo) })
	defer stop()
	pc.SetDeadline(deadline)

	remaining := deadline.Sub(c.now())
	if remaining <= 0 {
		return FetchResult{Outcome: OutcomeTimeout}, false, ErrTimeout
	}
	ms := (remaining + time.Millisecond - 1) / time.Millisecond
	op := c.seq.Add(1)
	pc.wbuf = appendFetch(pc.wbuf[:0], op, fetchReq{timeoutMs: uint32(min(ms, 1<<31)), digest: req.Digest, hashes: req.Hashes})

	// fail classifies an I/O error: cancellation and deadline void the
	// result; anything else keeps the verified prefix.
	gotAny := false
	fail := func(blocks []Block, err error) (FetchResult, bool, error) {
		if ctx.Err() != nil {
			return FetchResult{Outcome: OutcomeCancelled}, false, fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) || !c.now().Before(deadline) {
			return FetchResult{Outcome: OutcomeTimeout}, false, fmt.Errorf("%w after %d blocks", ErrTimeout, len(blocks))
		}
		stale := !gotAny && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE))
		return FetchResult{Blocks: blocks, Outcome: OutcomeFailed}, stale, err
	}

	if _, err := pc.Write(pc.wbuf); err != nil {
		return fail(nil, fmt.Errorf("send request: %w", err))
	}

	var hb [headerLen]byte
	var meta [blockMetaLen]byte
	var blocks []Block
	blockSize := -1
	for {
		h, err := readHeader(pc.br, &hb)
		if err != nil {
			if errors.Is(err, errBadMagic) {
				return FetchResult{Blocks: blocks, Outcome: OutcomeFailed}, false, fmt.Errorf("%w: %v", ErrProtocol, err)
			}
			return fail(blocks, fmt.Errorf("read frame: %w", err))
		}
		gotAny = true
		if h.version != Version && h.typ != typeRefuse {
			return FetchResult{Blocks: blocks, Outcome: OutcomeFailed}, false,
				fmt.Errorf("%w: %s frame of protocol version %d, want %d", ErrProtocol, h.typ, h.version, Version)
		}
		if h.op != op && !(h.typ == typeRefuse && h.op == 0) {
			return FetchResult{Blocks: blocks, Outcome: OutcomeFailed}, false,
				fmt.Errorf("%w: %s frame for operation %d, want %d", ErrProtocol, h.typ, h.op, op)
		}
		switch h.typ {
		case typeBlock:
			if h.length <= blockMetaLen || h.length-blockMetaLen > uint32(c.opts.MaxBlockBytes) {
				return FetchResult{Blocks: blocks, Outcome: OutcomeFailed}, false,
					fmt.Errorf("%w: block frame of %d bytes outside 1..%d payload bytes", ErrProtocol, h.length, c.opts.MaxBlockBytes)
			}
			size := int(h.length - blockMetaLen)
			if blockSize >= 0 && size != blockSize {
				return FetchResult{Blocks: blocks, Outcome: OutcomeFailed}, false,
					fmt.Errorf("%w: block of %d bytes after blocks of %d", ErrProtocol, size, blockSize)
			}
			blockSize = size
			if _, err := io.ReadFull(pc.br, meta[:]); err != nil {
				return fail(blocks, fmt.Errorf("read block: %w", err))
			}
			idx := binary.LittleEndian.Uint32(meta[0:])
			hash := binary.LittleEndian.Uint64(meta[4:])
			sum := binary.LittleEndian.Uint64(meta[12:])
			if int(idx) != len(blocks) || int(idx) >= len(req.Hashes) || req.Hashes[idx] != hash {
				return FetchResult{Blocks: blocks, Outcome: OutcomeFailed}, false,
					fmt.Errorf("%w: block %d (%016x) out of order or not requested (expected index %d)", ErrProtocol, idx, hash, len(blocks))
			}
			payload := make([]byte, size)
			if _, err := io.ReadFull(pc.br, payload); err != nil {
				return fail(blocks, fmt.Errorf("read block %d payload: %w", idx, err))
			}
			if got := kv.Checksum(payload); got != sum {
				return FetchResult{Blocks: blocks, Outcome: OutcomeCorrupt}, false,
					fmt.Errorf("%w: block %d (%016x): checksum %016x, source sent %016x", ErrCorrupt, idx, hash, got, sum)
			}
			if req.Verify != nil {
				if err := req.Verify(hash, payload); err != nil {
					return FetchResult{Blocks: blocks, Outcome: OutcomeCorrupt}, false,
						fmt.Errorf("%w: block %d: %v", ErrCorrupt, idx, err)
				}
			}
			blocks = append(blocks, Block{Hash: hash, Checksum: sum, Payload: payload})

		case typeDone, typeRefuse:
			if h.length > maxStatusFrame {
				return FetchResult{Blocks: blocks, Outcome: OutcomeFailed}, false,
					fmt.Errorf("%w: %s frame of %d bytes exceeds %d", ErrProtocol, h.typ, h.length, maxStatusFrame)
			}
			p := make([]byte, h.length)
			if _, err := io.ReadFull(pc.br, p); err != nil {
				return fail(blocks, fmt.Errorf("read %s: %w", h.typ, err))
			}
			st, err := decodeStatus(p)
			if err != nil {
				return FetchResult{Blocks: blocks, Outcome: OutcomeFailed}, false, fmt.Errorf("%w: %v", ErrProtocol, err)
			}
			if !c.now().Before(deadline) {
				// A late completion never turns a failure into success.
				return FetchResult{Outcome: OutcomeTimeout}, false,
					fmt.Errorf("%w: %s arrived after the deadline", ErrTimeout, h.typ)
			}
			if h.typ == typeRefuse {
				o := OutcomeRefused
				rerr := &RemoteError{Code: st.code, Message: st.msg}
				// The source keeps the connection only after a digest refusal.
				if st.code == CodeDigestMismatch && len(blocks) == 0 {
					return FetchResult{Outcome: o}, false, errReusable{rerr}
				}
				return FetchResult{Outcome: o}, false, rerr
			}
			if int(st.completed) != len(blocks) {
				return FetchResult{Blocks: blocks, Outcome: OutcomeFailed}, false,
					fmt.Errorf("%w: done reports %d blocks, %d arrived", ErrProtocol, st.completed, len(blocks))
			}
			if st.success {
				if len(blocks) == 0 {
					return FetchResult{Outcome: OutcomeFailed}, false, fmt.Errorf("%w: successful done with no blocks", ErrProtocol)
				}
				o := OutcomeSuccess
				if len(blocks) < len(req.Hashes) {
					o = OutcomePartial
				}
				return FetchResult{Blocks: blocks, Success: true, Outcome: o}, false, nil
			}
			rerr := &RemoteError{Code: st.code, Message: st.msg}
			switch st.code {
			case CodeNotFound:
				return FetchResult{Outcome: OutcomeNotFound}, false, errReusable{rerr}
			case CodeTimeout:
				return FetchResult{Outcome: OutcomeTimeout}, false, fmt.Errorf("%w: %w", ErrTimeout, rerr)
			case CodeShutdown:
				return FetchResult{Blocks: blocks, Outcome: OutcomeFailed}, false, rerr
			}
			return FetchResult{Blocks: blocks, Outcome: OutcomeFailed}, false, errReusable{rerr}

		default:
			return FetchResult{Blocks: blocks, Outcome: OutcomeFailed}, false,
				fmt.Errorf("%w: unexpected %s frame from a source", ErrProtocol, h.typ)
		}
	}
}

// errReusable marks a failure after which the connection is still in a
// clean state (the exchange ended with a well-formed final frame).
type errReusable struct{ error }

func (e errReusable) Unwrap() error { return e.error }
