package transfer

import (
	"context"
	"crypto/tls"
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
	// Domain is the salt domain of the request the blocks are for (kv.Seed
	// of its LoRA and cache salt; 0 means kv.BaseSeed): a source that knows
	// its blocks' domains serves only those stored in this one.
	Domain uint64
	// Timeout overrides the client's operation timeout.
	Timeout time.Duration
	// Verify, when set, checks each block's bytes after its checksum (e.g.
	// PayloadVerifier); an error ends the usable prefix at that block. It
	// is called once per block, in order and never concurrently, but for
	// large responses from a goroutine other than the caller's.
	Verify func(hash uint64, payload []byte) error
	// Buffer, when non-nil, is memory to receive into (its whole
	// capacity). Payloads that fit land in it without a copy and Blocks
	// alias it, so it must not be reused while they are in use; the rest
	// goes to fresh memory. Sized blocks×(32+block bytes)+1044, it holds a
	// whole response; reusing it across fetches saves the allocation and
	// page faults that otherwise dominate large fetches.
	Buffer []byte
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

	pool   *chunkPool // where Release returns chunks
	chunks [][]byte   // receive chunks the client allocated for Blocks
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
	// Token, when set, is the fleet token proven to every source on each
	// new connection (auth.go).
	Token []byte
	// TLS, when set, wraps every connection in TLS (with a client
	// certificate for mutual TLS); ServerName defaults to the endpoint's host.
	TLS *tls.Config
}

// Client fetches blocks from control endpoints. It is safe for concurrent
// use; each fetch in flight uses its own connection.
type Client struct {
	opts   ClientOptions
	dialer net.Dialer
	now    func() time.Time // tests move time
	seq    atomic.Uint32

	chunks chunkPool
	// asyncMin is the response size (payload bytes requested) from which
	// blocks are verified by a second goroutine; tests lower it.
	asyncMin int

	mu     sync.Mutex
	idle   map[string][]*conn
	closed bool
}

type conn struct {
	net.Conn
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
	return &Client{opts: o, now: time.Now, asyncMin: asyncVerifyMin, idle: make(map[string][]*conn)}
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
	ep, err := kv.ParseEndpoint(endpoint)
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
			if errors.Is(err, context.DeadlineExceeded) {
				return FetchResult{Outcome: OutcomeTimeout}, fmt.Errorf("%w: %v", ErrTimeout, err)
			}
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
		x := c.exchange(ctx, pc, req, deadline)
		if len(x.res.Blocks) == 0 {
			for _, ch := range x.chunks {
				c.chunks.put(ch)
			}
		} else {
			x.res.pool, x.res.chunks = &c.chunks, x.chunks
		}
		if x.stale && reused && attempt == 0 {
			// A pooled connection the source closed while idle: the
			// request never reached a handler, so one fresh try is safe.
			pc.Close()
			continue
		}
		if x.reuse {
			c.put(addr, pc)
		} else {
			pc.Close()
		}
		return x.res, x.err
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
	if c.opts.TLS != nil {
		host, _, _ := net.SplitHostPort(addr)
		tc, err := clientTLS(dctx, nc, c.opts.TLS, host)
		if err != nil {
			nc.Close()
			return nil, err
		}
		nc = tc
	}
	if len(c.opts.Token) > 0 {
		if err := clientHandshake(nc, c.opts.Token, deadline); err != nil {
			nc.Close()
			return nil, err
		}
	}
	return &conn{Conn: nc}, nil
}

func (c *Client) dialFailure(ctx context.Context, err error, deadline time.Time) (FetchResult, error) {
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		return FetchResult{Outcome: OutcomeCancelled}, fmt.Errorf("dial: %w", ctx.Err())
	case ctx.Err() != nil || !c.now().Before(deadline) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
		return FetchResult{Outcome: OutcomeTimeout}, fmt.Errorf("%w: dial: %v", ErrTimeout, err)
	}
	if errors.Is(err, ErrUnauthenticated) {
		return FetchResult{Outcome: OutcomeRefused}, err
	}
	return FetchResult{Outcome: OutcomeUnreachable}, fmt.Errorf("%w: %v", ErrUnreachable, err)
}

// aLongTimeAgo unblocks every pending read and write on a connection.
var aLongTimeAgo = time.Unix(1, 0)

// exchanged is the end of one request/response on a connection.
type exchanged struct {
	res    FetchResult
	err    error
	reuse  bool // the response ended cleanly; the connection can be pooled
	stale  bool // the peer closed before any response byte (idle pooled conn)
	chunks [][]byte
}

// recvBuf receives one response into chunks that become the blocks' memory:
// reads are as large as the chunk allows and payloads are never copied
// again. Chunks grow with the response, so the memory a fetch allocates
// follows what the source actually sends, never what a header declares.
type recvBuf struct {
	c        net.Conn
	pool     *chunkPool
	chunks   [][]byte // chunks taken from pool
	buf      []byte
	r, w     int
	frameLen int    // block frame size once known; 0 before
	onRead   func() // called before every socket read (hands work to the verifier)
}

// statusSlack is room for one frame header or one whole done/refuse frame.
const statusSlack = headerLen + maxStatusFrame

// ensure makes buf[r:r+n] hold received bytes, first moving the unparsed
// tail into a fresh chunk of max(n, size) bytes if n does not fit. r must
// be at a frame boundary.
func (b *recvBuf) ensure(n, size int) error {
	if b.r+n > len(b.buf) {
		nb := b.pool.get(max(n, size))
		b.chunks = append(b.chunks, nb)
		b.w = copy(nb, b.buf[b.r:b.w])
		b.buf, b.r = nb, 0
	}
	// Read ahead only as far as whole block frames fit in this chunk (plus
	// room for a header or the done frame): a frame that would straddle
	// the chunk's end is never half-read, so it never has to be copied
	// into the next chunk.
	end := len(b.buf)
	if b.frameLen == 0 {
		end = min(end, b.r+statusSlack)
	} else if k := (len(b.buf) - b.r - statusSlack) / b.frameLen; k >= 1 {
		end = b.r + k*b.frameLen + statusSlack
	} else {
		end = min(end, b.r+statusSlack)
	}
	end = min(max(end, b.r+n), len(b.buf))
	for b.w-b.r < n {
		if b.onRead != nil {
			b.onRead()
		}
		// Bounded reads keep a block in cache between its arrival and its
		// checksum.
		m, err := b.c.Read(b.buf[b.w:min(end, b.w+maxRead)])
		b.w += m
		if err != nil && b.w-b.r < n {
			if errors.Is(err, io.EOF) && b.w > b.r {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// maxRead bounds one socket read.
const maxRead = 1 << 20

// take consumes n ensured bytes.
func (b *recvBuf) take(n int) []byte {
	p := b.buf[b.r : b.r+n : b.r+n]
	b.r += n
	return p
}

// exchange runs one fetch on pc; a cancelled ctx unblocks it at once.
func (c *Client) exchange(ctx context.Context, pc *conn, req FetchRequest, deadline time.Time) exchanged {
	pc.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { pc.SetDeadline(aLongTimeAgo) })
	rb := recvBuf{c: pc.Conn, pool: &c.chunks, buf: req.Buffer[:cap(req.Buffer)]}
	x := c.exchangeOnce(ctx, pc, req, deadline, &rb)
	x.chunks = rb.chunks
	if !stop() {
		// The cancel hook ran (or is running) and may still poison the
		// connection's deadline: never pool it.
		x.reuse = false
	}
	return x
}

func (c *Client) exchangeOnce(ctx context.Context, pc *conn, req FetchRequest, deadline time.Time, rb *recvBuf) (x exchanged) {
	// v verifies a large response's blocks on another goroutine while this
	// one reads on; whatever ends the exchange waits for it and cuts the
	// result at the first bad block.
	var v *verifier
	defer func() {
		if v != nil {
			x = v.finish(x, c.now, deadline)
		}
	}()

	remaining := deadline.Sub(c.now())
	if remaining <= 0 {
		return exchanged{res: FetchResult{Outcome: OutcomeTimeout}, err: ErrTimeout}
	}
	ms := (remaining + time.Millisecond - 1) / time.Millisecond
	op := c.seq.Add(1)
	pc.wbuf = appendFetch(pc.wbuf[:0], op, fetchReq{timeoutMs: uint32(min(ms, 1<<31)), digest: req.Digest, hashes: req.Hashes, domain: req.Domain})

	var blocks []Block
	gotAny := false
	// protocol ends the exchange on a source that broke the protocol.
	protocol := func(format string, a ...any) exchanged {
		return exchanged{res: FetchResult{Blocks: blocks, Outcome: OutcomeFailed}, err: fmt.Errorf("%w: "+format, append([]any{ErrProtocol}, a...)...)}
	}
	// ioFail classifies an I/O error: cancellation and deadline void the
	// result; anything else keeps the verified prefix.
	ioFail := func(err error) exchanged {
		if errors.Is(ctx.Err(), context.Canceled) {
			return exchanged{res: FetchResult{Outcome: OutcomeCancelled}, err: fmt.Errorf("%w (%v)", ctx.Err(), err)}
		}
		if ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) || !c.now().Before(deadline) {
			return exchanged{res: FetchResult{Outcome: OutcomeTimeout}, err: fmt.Errorf("%w after %d blocks", ErrTimeout, len(blocks))}
		}
		stale := !gotAny && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE))
		return exchanged{res: FetchResult{Blocks: blocks, Outcome: OutcomeFailed}, err: err, stale: stale}
	}

	if _, err := pc.Write(pc.wbuf); err != nil {
		return ioFail(fmt.Errorf("send request: %w", err))
	}

	frameLen, growth := 0, 0 // block frame size and chunk growth, once known
	planned := func() int {
		if frameLen == 0 {
			return 2 * statusSlack // a status frame, or the start of the first block
		}
		frames := max(1, min(len(req.Hashes)-len(blocks), growth))
		return frames*frameLen + statusSlack
	}
	for {
		if err := rb.ensure(headerLen, planned()); err != nil {
			return ioFail(fmt.Errorf("read frame: %w", err))
		}
		gotAny = true
		h, err := parseHeader(rb.buf[rb.r:])
		if err != nil {
			return protocol("%v", err)
		}
		if h.version != Version && h.typ != typeRefuse {
			return protocol("%s frame of protocol version %d, want %d", h.typ, h.version, Version)
		}
		if h.op != op && !(h.typ == typeRefuse && h.op == 0) {
			return protocol("%s frame for operation %d, want %d", h.typ, h.op, op)
		}
		switch h.typ {
		case typeBlock:
			if h.length <= blockMetaLen || h.length-blockMetaLen > uint32(c.opts.MaxBlockBytes) {
				return protocol("block frame of %d bytes outside 1..%d payload bytes", h.length, c.opts.MaxBlockBytes)
			}
			fl := headerLen + int(h.length)
			if frameLen == 0 {
				frameLen, rb.frameLen = fl, fl
				growth = max(1, (1<<20)/fl)
				if int64(fl)*int64(len(req.Hashes)) >= int64(c.asyncMin) {
					v = startVerifier(req.Verify)
					rb.onRead = func() { v.submit(blocks) }
				}
			} else if fl != frameLen {
				return protocol("block of %d bytes after blocks of %d", fl-headerLen-blockMetaLen, frameLen-headerLen-blockMetaLen)
			}
			if rb.r+fl > len(rb.buf) {
				// Next chunk: double the frames per chunk up to ~16 MiB.
				size := planned()
				growth = min(growth*2, max(1, (16<<20)/fl))
				if err := rb.ensure(fl, size); err != nil {
					return ioFail(fmt.Errorf("read block %d: %w", len(blocks), err))
				}
			} else if err := rb.ensure(fl, 0); err != nil {
				return ioFail(fmt.Errorf("read block %d: %w", len(blocks), err))
			}
			f := rb.take(fl)
			meta := f[headerLen:]
			idx := binary.LittleEndian.Uint32(meta[0:])
			hash := binary.LittleEndian.Uint64(meta[4:])
			sum := binary.LittleEndian.Uint64(meta[12:])
			if int(idx) != len(blocks) || int(idx) >= len(req.Hashes) || req.Hashes[idx] != hash {
				return protocol("block %d (%016x) out of order or not requested (expected index %d)", idx, hash, len(blocks))
			}
			b := Block{Hash: hash, Checksum: sum, Payload: f[headerLen+blockMetaLen:]}
			if v == nil {
				if err := checkBlock(int(idx), b, req.Verify); err != nil {
					return exchanged{res: FetchResult{Blocks: blocks, Outcome: OutcomeCorrupt}, err: err}
				}
			} else if v.failed() {
				// finish cuts the blocks and says why.
				return exchanged{res: FetchResult{Blocks: blocks, Outcome: OutcomeCorrupt}}
			}
			blocks = append(blocks, b)

		case typeDone, typeRefuse:
			if h.length > maxStatusFrame {
				return protocol("%s frame of %d bytes exceeds %d", h.typ, h.length, maxStatusFrame)
			}
			fl := headerLen + int(h.length)
			if err := rb.ensure(fl, fl); err != nil {
				return ioFail(fmt.Errorf("read %s: %w", h.typ, err))
			}
			st, err := decodeStatus(rb.take(fl)[headerLen:])
			if err != nil {
				return protocol("%v", err)
			}
			// Nothing may follow the final frame; if something did, the
			// connection is not clean enough to reuse.
			clean := rb.r == rb.w
			if !c.now().Before(deadline) {
				// A late completion never turns a failure into success.
				return exchanged{res: FetchResult{Outcome: OutcomeTimeout},
					err: fmt.Errorf("%w: %s arrived after the deadline", ErrTimeout, h.typ)}
			}
			rerr := &RemoteError{Code: st.code, Message: st.msg}
			if h.typ == typeRefuse {
				// The source keeps the connection only after a digest refusal.
				return exchanged{res: FetchResult{Outcome: OutcomeRefused}, err: rerr,
					reuse: clean && st.code == CodeDigestMismatch && len(blocks) == 0}
			}
			if int(st.completed) != len(blocks) {
				return protocol("done reports %d blocks, %d arrived", st.completed, len(blocks))
			}
			if st.success {
				if len(blocks) == 0 {
					return protocol("successful done with no blocks")
				}
				o := OutcomeSuccess
				if len(blocks) < len(req.Hashes) {
					o = OutcomePartial
				}
				return exchanged{res: FetchResult{Blocks: blocks, Success: true, Outcome: o}, reuse: clean}
			}
			switch st.code {
			case CodeNotFound:
				return exchanged{res: FetchResult{Outcome: OutcomeNotFound}, err: rerr, reuse: clean}
			case CodeTimeout:
				return exchanged{res: FetchResult{Outcome: OutcomeTimeout}, err: fmt.Errorf("%w: %w", ErrTimeout, rerr)}
			case CodeShutdown:
				return exchanged{res: FetchResult{Blocks: blocks, Outcome: OutcomeFailed}, err: rerr}
			}
			return exchanged{res: FetchResult{Blocks: blocks, Outcome: OutcomeFailed}, err: rerr, reuse: clean}

		default:
			return protocol("unexpected %s frame from a source", h.typ)
		}
	}
}

// asyncVerifyMin is the response size from which a fetch verifies blocks on
// a second goroutine while it keeps reading. Loopback TCP runs markedly
// faster when the reader returns to the socket at once: hashing between
// reads costs more than the hashing itself.
const asyncVerifyMin = 1 << 20

// checkBlock verifies block idx's checksum, then its bytes with verify.
func checkBlock(idx int, b Block, verify func(uint64, []byte) error) error {
	if got := kv.Checksum(b.Payload); got != b.Checksum {
		return fmt.Errorf("%w: block %d (%016x): checksum %016x, source sent %016x", ErrCorrupt, idx, b.Hash, got, b.Checksum)
	}
	if verify != nil {
		if err := verify(b.Hash, b.Payload); err != nil {
			return fmt.Errorf("%w: block %d: %v", ErrCorrupt, idx, err)
		}
	}
	return nil
}

// verifier checks received blocks in order on its own goroutine. Each
// submitted run aliases the reader's blocks slice, whose submitted elements
// the reader never writes again (an append that grows the slice copies
// them and leaves the old array alone).
type verifier struct {
	verify func(uint64, []byte) error
	runs   chan blockRun
	done   chan struct{}
	sent   int
	bad    atomic.Int64 // index of the first bad block; -1 while none
	err    error        // why; written before bad, read after done
}

// blockRun is blocks[start : start+len(run)] of a response.
type blockRun struct {
	start int
	run   []Block
}

func startVerifier(verify func(uint64, []byte) error) *verifier {
	v := &verifier{verify: verify, runs: make(chan blockRun, 64), done: make(chan struct{})}
	v.bad.Store(-1)
	go v.run()
	return v
}

func (v *verifier) run() {
	defer close(v.done)
	for r := range v.runs {
		for i := 0; i < len(r.run) && v.bad.Load() < 0; i++ {
			if err := checkBlock(r.start+i, r.run[i], v.verify); err != nil {
				v.err = err
				v.bad.Store(int64(r.start + i))
			}
		}
	}
}

// submit hands the blocks not yet submitted to the verifier.
func (v *verifier) submit(blocks []Block) {
	if len(blocks) > v.sent {
		v.runs <- blockRun{v.sent, blocks[v.sent:len(blocks):len(blocks)]}
		v.sent = len(blocks)
	}
}

func (v *verifier) failed() bool { return v.bad.Load() >= 0 }

// finish verifies the rest of x's blocks, waits for the verifier and cuts
// x at the first bad block (OutcomeCorrupt, whatever ended the exchange
// after it). A result still good at the deadline is a timeout, as a done
// frame arriving after it would be.
func (v *verifier) finish(x exchanged, now func() time.Time, deadline time.Time) exchanged {
	v.submit(x.res.Blocks)
	close(v.runs)
	<-v.done
	if bad := v.bad.Load(); bad >= 0 && int(bad) < len(x.res.Blocks) {
		return exchanged{res: FetchResult{Blocks: x.res.Blocks[:bad], Outcome: OutcomeCorrupt}, err: v.err}
	}
	if x.res.Success && !now().Before(deadline) {
		return exchanged{res: FetchResult{Outcome: OutcomeTimeout},
			err: fmt.Errorf("%w: blocks verified after the deadline", ErrTimeout)}
	}
	return x
}

// Release tells the source at endpoint that this side is done with the
// handoff id (a prefill answer's pinned blocks): it read them, or found it
// needs none. It reports whether the source released a pin by that id; a
// source that held none answers false without an error. The source's own
// expiry stays the fallback, so a failed release costs only the pinned
// blocks' time: callers may ignore the error. A source older than the
// release frame refuses it (bad_request, an error here).
func (c *Client) Release(ctx context.Context, endpoint, id string) (bool, error) {
	if id == "" || len(id) > MaxHandoffIDLen {
		return false, fmt.Errorf("release: handoff id of %d bytes (want 1..%d)", len(id), MaxHandoffIDLen)
	}
	ep, err := kv.ParseEndpoint(endpoint)
	if err != nil {
		return false, fmt.Errorf("release: %w", err)
	}
	deadline := c.now().Add(c.opts.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	addr := ep.Addr()
	for attempt := 0; ; attempt++ {
		pc := c.get(addr)
		reused := pc != nil
		if pc == nil {
			if pc, err = c.dial(ctx, addr, deadline); err != nil {
				return false, fmt.Errorf("release %s: %w", endpoint, err)
			}
		}
		released, keep, stale, err := c.releaseOnce(ctx, pc, id, deadline)
		if stale && reused && attempt == 0 {
			pc.Close()
			continue
		}
		if keep {
			c.put(addr, pc)
		} else {
			pc.Close()
		}
		if err != nil {
			err = fmt.Errorf("release %s: %w", endpoint, err)
		}
		return released, err
	}
}

// releaseOnce runs one release exchange on pc: release → done or refuse.
func (c *Client) releaseOnce(ctx context.Context, pc *conn, id string, deadline time.Time) (released, keep, stale bool, err error) {
	pc.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { pc.SetDeadline(aLongTimeAgo) })
	defer stop()
	op := c.seq.Add(1)
	pc.wbuf = appendRelease(pc.wbuf[:0], op, id)
	if _, err := pc.Write(pc.wbuf); err != nil {
		return false, false, false, fmt.Errorf("send: %w", err)
	}
	var hb [headerLen]byte
	h, err := readHeader(pc, &hb)
	if err != nil {
		stale = errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return false, false, stale, err
	}
	switch {
	case h.version != Version:
		return false, false, false, fmt.Errorf("%w: answer of version %d", ErrProtocol, h.version)
	case h.typ != typeDone && h.typ != typeRefuse:
		return false, false, false, fmt.Errorf("%w: %s frame answers a release", ErrProtocol, h.typ)
	case h.op != op:
		return false, false, false, fmt.Errorf("%w: answer for op %d, sent %d", ErrProtocol, h.op, op)
	case h.length > maxStatusFrame:
		return false, false, false, fmt.Errorf("%w: status frame of %d bytes", ErrProtocol, h.length)
	}
	p := make([]byte, h.length)
	if _, err := io.ReadFull(pc, p); err != nil {
		return false, false, false, err
	}
	st, err := decodeStatus(p)
	if err != nil {
		return false, false, false, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	if h.typ == typeRefuse {
		// An older source closes the connection after refusing a frame
		// it does not know; a current one keeps it.
		return false, false, false, &RemoteError{Code: st.code, Message: st.msg}
	}
	return st.success, true, false, nil
}
