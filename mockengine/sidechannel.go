package mockengine

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/transfer"
)

// BlockPinner is the part of one sim rank (*sim.Engine) that leases need.
type BlockPinner interface {
	PinBlocks(seqs []kv.SeqHash) ([]int32, func())
	Pin(seqs []kv.SeqHash) (int, func())
	ReadPayload(seq kv.SeqHash, layer int, dst []byte) (int, error)
	BlockChecksum(seq kv.SeqHash) (uint64, bool)
}

// LeaseStats counts a Leases' work.
type LeaseStats struct {
	Granted  uint64 // leases granted
	Consumed uint64 // ended by their consumers' notifications
	Expired  uint64 // ended by the lease running out
	Unknown  uint64 // notifications naming no held lease
	Held     int    // leases held now
	Blocks   int    // distinct blocks held by leases or transfers now
}

// Leases holds the blocks a producer (a P/D prefill) pinned for consumers
// that will pull them: each lease is named by the producer's request id
// and lists pool block ids. A lease ends when its consumers have all
// notified, or when it runs out (vLLM's kv_lease_duration); its pin is then
// released and the blocks are ordinary cached blocks again. Leases is also
// the transfer.BlockSource its side channel serves: a block is addressed by
// its pool id (the u64 "hash" of a transfer fetch), as a NIXL READ
// addresses the producer's block ids.
type Leases struct {
	eng               BlockPinner
	layers, layerSize int
	ttl               time.Duration

	mu     sync.Mutex
	byReq  map[string]*lease
	byID   map[int32]*leasedBlock
	closed bool

	granted, consumed, expired, unknown atomic.Uint64
}

type lease struct {
	ids     []int32
	release func()
	timer   *time.Timer
	need    int // consumers expected (from the first notification)
	got     int
	done    chan struct{} // closed when the lease ends
}

type leasedBlock struct {
	seq  kv.SeqHash
	refs int // leases and transfers holding it
}

// NewLeases returns an empty lease table over one rank's cache, whose
// blocks have layers payload slices of layerSize bytes; ttl is the lease.
func NewLeases(eng BlockPinner, layers, layerSize int, ttl time.Duration) *Leases {
	return &Leases{eng: eng, layers: layers, layerSize: layerSize, ttl: ttl,
		byReq: make(map[string]*lease), byID: make(map[int32]*leasedBlock)}
}

// Grant pins the cached leading blocks of seqs under a lease named reqID
// and returns their pool ids (fewer than seqs when some were evicted
// already; none when none is cached or reqID already holds a lease).
func (l *Leases) Grant(reqID string, seqs []kv.SeqHash) []int32 {
	ids, release := l.eng.PinBlocks(seqs)
	if len(ids) == 0 {
		release()
		return nil
	}
	l.mu.Lock()
	if _, dup := l.byReq[reqID]; dup || l.closed {
		l.mu.Unlock()
		release()
		return nil
	}
	le := &lease{ids: ids, release: release, done: make(chan struct{})}
	for i, id := range ids {
		b := l.byID[id]
		if b == nil {
			b = &leasedBlock{seq: seqs[i]}
			l.byID[id] = b
		}
		b.refs++
	}
	l.byReq[reqID] = le
	le.timer = time.AfterFunc(l.ttl, func() {
		if l.end(reqID, le) {
			l.expired.Add(1)
		}
	})
	l.mu.Unlock()
	l.granted.Add(1)
	return ids
}

// Notify records that one consumer of reqID's lease is done with its
// blocks ("request_id:consumers" in vLLM's notification): the lease ends
// once consumers notifications have arrived. It reports whether reqID held
// a lease.
func (l *Leases) Notify(reqID string, consumers int) bool {
	l.mu.Lock()
	le := l.byReq[reqID]
	if le == nil {
		l.mu.Unlock()
		l.unknown.Add(1)
		return false
	}
	if le.need == 0 {
		le.need = max(consumers, 1)
	}
	le.got++
	done := le.got >= le.need
	l.mu.Unlock()
	if done && l.end(reqID, le) {
		l.consumed.Add(1)
	}
	return true
}

// Done is closed when reqID's lease ends (its consumers notified, or it
// ran out); it is closed already when reqID holds none.
func (l *Leases) Done(reqID string) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if le := l.byReq[reqID]; le != nil {
		return le.done
	}
	c := make(chan struct{})
	close(c)
	return c
}

// end removes le if it is still reqID's lease and releases its pin.
func (l *Leases) end(reqID string, le *lease) bool {
	l.mu.Lock()
	if l.byReq[reqID] != le {
		l.mu.Unlock()
		return false
	}
	delete(l.byReq, reqID)
	le.timer.Stop()
	close(le.done)
	l.unref(le.ids)
	l.mu.Unlock()
	le.release()
	return true
}

func (l *Leases) unref(ids []int32) {
	for _, id := range ids {
		if b := l.byID[id]; b != nil {
			if b.refs--; b.refs <= 0 {
				delete(l.byID, id)
			}
		}
	}
}

// Stats returns the counters and what is held now.
func (l *Leases) Stats() LeaseStats {
	l.mu.Lock()
	held, blocks := len(l.byReq), len(l.byID)
	l.mu.Unlock()
	return LeaseStats{Granted: l.granted.Load(), Consumed: l.consumed.Load(), Expired: l.expired.Load(),
		Unknown: l.unknown.Load(), Held: held, Blocks: blocks}
}

// Close ends every lease.
func (l *Leases) Close() {
	l.mu.Lock()
	l.closed = true
	all := make(map[string]*lease, len(l.byReq))
	for k, v := range l.byReq {
		all[k] = v
	}
	l.mu.Unlock()
	for k, v := range all {
		l.end(k, v)
	}
}

// Pin implements transfer.BlockSource: hashes are pool block ids; it pins
// the longest prefix of them that leases hold.
func (l *Leases) Pin(hashes []uint64) (int, func()) {
	l.mu.Lock()
	var ids []int32
	var seqs []kv.SeqHash
	for _, h := range hashes {
		if h > 1<<31-1 {
			break
		}
		b := l.byID[int32(h)]
		if b == nil {
			break
		}
		b.refs++
		ids = append(ids, int32(h))
		seqs = append(seqs, b.seq)
	}
	l.mu.Unlock()
	// The engine pin keeps the bytes even if the lease ends mid-transfer.
	n, release := l.eng.Pin(seqs)
	return n, func() {
		release()
		l.mu.Lock()
		l.unref(ids)
		l.mu.Unlock()
	}
}

func (l *Leases) seqOf(hash uint64) (kv.SeqHash, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if b := l.byID[int32(hash)]; hash <= 1<<31-1 && b != nil {
		return b.seq, nil
	}
	return 0, fmt.Errorf("block id %d is not leased", hash)
}

// ReadBlock implements transfer.BlockSource.
func (l *Leases) ReadBlock(hash uint64, dst []byte) ([]byte, error) {
	seq, err := l.seqOf(hash)
	if err != nil {
		return dst, err
	}
	start := len(dst)
	need := l.layers * l.layerSize
	if cap(dst)-start < need {
		nd := make([]byte, start, start+need)
		copy(nd, dst)
		dst = nd
	}
	dst = dst[:start+need]
	for layer := 0; layer < l.layers; layer++ {
		if _, err := l.eng.ReadPayload(seq, layer, dst[start+layer*l.layerSize:start+(layer+1)*l.layerSize]); err != nil {
			return dst[:start], fmt.Errorf("block id %d layer %d: %w", hash, layer, err)
		}
	}
	return dst, nil
}

// BlockChecksum implements transfer.BlockChecksummer with the checksum the
// engine took when it stored the block.
func (l *Leases) BlockChecksum(hash uint64) (uint64, bool) {
	seq, err := l.seqOf(hash)
	if err != nil {
		return 0, false
	}
	return l.eng.BlockChecksum(seq)
}

// The side channel's notification wire. A connection starting with the
// transfer magic "KT" is a block pull (package transfer's protocol, block
// ids as hashes); one starting with "KN" carries notifications, each
//
//	"KN" u8 version (1) u8 type (1 notify) u16 length (LE, ≤ 1024) message
//
// where message is "request_id:consumers" as vLLM's NixlConnector sends
// it. The answer is "KN" 1 0x81 u8 status (0 ok, 1 no such lease, 2 bad
// message). Anything else is disconnected.
const (
	notifyVersion   = 1
	notifyType      = 1
	notifyReplyType = 0x81
	maxNotifyLen    = 1024

	notifyOK      = 0
	notifyUnknown = 1
	notifyBad     = 2
)

// ErrNoLease is returned by Notify when the producer holds no lease by
// that id (it expired, or was never granted).
var ErrNoLease = errors.New("producer holds no lease for that request")

// SideChannel is one rank's P/D side-channel port (vLLM's
// VLLM_NIXL_SIDE_CHANNEL_PORT + rank): block pulls and notifications.
type SideChannel struct {
	ln     net.Listener
	xferLn *chanListener
	leases *Leases
	rooms  atomic.Pointer[RoomLookup] // SGLang's bootstrap lookups; nil refuses them
	log    *slog.Logger
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// ServeSideChannel listens on addr (host:port; port 0 picks one) and
// serves leases' blocks (refusing fetches whose digest differs from
// digest) and notifications until Close.
func ServeSideChannel(addr string, leases *Leases, digest string, log *slog.Logger) (*SideChannel, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("side channel: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &SideChannel{ln: ln, leases: leases, log: log, cancel: cancel,
		xferLn: &chanListener{addr: ln.Addr(), conns: make(chan net.Conn), done: make(chan struct{})}}
	srv := &transfer.Server{Source: leases, Digest: digest, Logger: log}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		if err := srv.Serve(ctx, s.xferLn); err != nil {
			log.Warn("side channel transfer server stopped", "err", err)
		}
	}()
	go s.accept(ctx)
	return s, nil
}

// Port is the bound port.
func (s *SideChannel) Port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// Close stops serving and waits for the handlers.
func (s *SideChannel) Close() error {
	s.cancel()
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

func (s *SideChannel) accept(ctx context.Context) {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				s.log.Warn("side channel accept failed", "err", err)
			}
			return
		}
		s.wg.Add(1)
		go s.route(ctx, c)
	}
}

// route reads the magic and hands the connection to its protocol.
func (s *SideChannel) route(ctx context.Context, c net.Conn) {
	defer s.wg.Done()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var magic [2]byte
	if _, err := io.ReadFull(c, magic[:]); err != nil {
		c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	switch string(magic[:]) {
	case "KT":
		select {
		case s.xferLn.conns <- &prefixConn{Conn: c, prefix: magic[:]}:
		case <-ctx.Done():
			c.Close()
		}
	case "KN":
		stop := context.AfterFunc(ctx, func() { c.Close() })
		defer stop()
		s.serveNotify(c)
	case "KB":
		stop := context.AfterFunc(ctx, func() { c.Close() })
		defer stop()
		s.serveBootstrap(ctx, c)
	default:
		c.Close()
	}
}

func (s *SideChannel) serveNotify(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	first := true
	for {
		_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
		var hdr [6]byte
		off := 0
		if first {
			copy(hdr[:], "KN")
			off = 2
		}
		if _, err := io.ReadFull(r, hdr[off:]); err != nil {
			return
		}
		first = false
		if string(hdr[:2]) != "KN" || hdr[2] != notifyVersion || hdr[3] != notifyType {
			return
		}
		n := int(binary.LittleEndian.Uint16(hdr[4:]))
		if n > maxNotifyLen {
			return
		}
		msg := make([]byte, n)
		if _, err := io.ReadFull(r, msg); err != nil {
			return
		}
		status := byte(notifyOK)
		reqID, consumers, ok := parseNotification(string(msg))
		switch {
		case !ok:
			status = notifyBad
		case !s.leases.Notify(reqID, consumers):
			status = notifyUnknown
		}
		if _, err := c.Write([]byte{'K', 'N', notifyVersion, notifyReplyType, status}); err != nil {
			return
		}
	}
}

// parseNotification splits "request_id:consumers" at the last colon
// (request ids may contain colons).
func parseNotification(msg string) (string, int, bool) {
	i := strings.LastIndexByte(msg, ':')
	if i <= 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(msg[i+1:])
	if err != nil || n < 1 {
		return "", 0, false
	}
	return msg[:i], n, true
}

// Notify tells the producer at addr (host:port) that one consumer is done
// with reqID's blocks.
func Notify(ctx context.Context, addr, reqID string, consumers int) error {
	msg := reqID + ":" + strconv.Itoa(consumers)
	if len(msg) > maxNotifyLen {
		return fmt.Errorf("notify: message of %d bytes exceeds %d", len(msg), maxNotifyLen)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("notify %s: %w", addr, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	} else {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	}
	buf := make([]byte, 6, 6+len(msg))
	copy(buf, "KN")
	buf[2], buf[3] = notifyVersion, notifyType
	binary.LittleEndian.PutUint16(buf[4:], uint16(len(msg)))
	buf = append(buf, msg...)
	if _, err := c.Write(buf); err != nil {
		return fmt.Errorf("notify %s: %w", addr, err)
	}
	var rep [5]byte
	if _, err := io.ReadFull(c, rep[:]); err != nil {
		return fmt.Errorf("notify %s: %w", addr, err)
	}
	if string(rep[:2]) != "KN" || rep[3] != notifyReplyType {
		return fmt.Errorf("notify %s: malformed reply", addr)
	}
	switch rep[4] {
	case notifyOK:
		return nil
	case notifyUnknown:
		return fmt.Errorf("notify %s: %q: %w", addr, reqID, ErrNoLease)
	}
	return fmt.Errorf("notify %s: producer rejected %q", addr, msg)
}

// chanListener is a net.Listener fed by the side channel's router.
type chanListener struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }

// prefixConn replays the bytes the router read before the protocol's own
// reader.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
