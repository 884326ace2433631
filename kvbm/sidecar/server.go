package sidecar

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvmesh/kvmesh/internal/streamcopy"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/kvbm"
)

// Storage is a tier storage the server opens at registration and closes
// at Close.
type Storage interface {
	kvbm.Storage
	io.Closer
}

// Config shapes a Server. The tiers are created when the engine's worker
// registers its KV cache: only then are the block's bytes known.
type Config struct {
	Socket string // the Unix socket to serve (created mode 0600)
	ShmDir string // where the arena file goes; /dev/shm if empty
	Name   string // the arena file's name stem (unique per worker)

	HostBlocks    int // host tier (G2) slots, in the shared arena
	StagingBlocks int // staging slots the engine's worker copies through
	DiskBlocks    int
	// OpenDisk opens the disk tier's pool file (with DiskBlocks > 0);
	// reopened reports a file that existed, whose blocks are recovered.
	OpenDisk   func(slots, blockBytes int) (s Storage, reopened bool, err error)
	DiskFilter kvbm.FilterConfig
	// OpenObject opens the object tier (nil: none); its blocks are
	// recovered at registration.
	OpenObject   func(slots, blockBytes int) (Storage, error)
	ObjectBlocks int

	// BlockSize, if non-zero, is the engine's tokens per block; a
	// registration that disagrees is refused.
	BlockSize int
	// RecomputePerToken > 0 weighs each match's load against recomputing
	// it (kvbm.LoadCost) at Bandwidth bytes/s per tier (index kv.Tier;
	// ≤ 0: free).
	RecomputePerToken time.Duration
	Bandwidth         [kv.NumTiers]float64

	Worker kv.WorkerKey // stamped on the tiers' events (SetEventSink says where they go)
	// Timeout bounds reading a frame's payload once its header arrived and
	// writing a reply; 5 s if zero.
	Timeout time.Duration
	Logger  *slog.Logger
}

// Server is the Go half of kvmesh's engine connector: it serves the
// engine's scheduler and worker processes (package kvmesh_kvbm) over a Unix
// socket, forwarding each call to kvbm's connector leaders, and owns the
// shared arena they copy blocks through.
type Server struct {
	cfg Config
	ln  *net.UnixListener
	log *slog.Logger

	mu       sync.Mutex // one slot state machine: every call runs under it
	arena    *arena
	mgr      *kvbm.Manager
	conn     *kvbm.Connector
	vllm     *kvbm.VLLMLeader
	trt      *kvbm.TRTLLMLeader
	wk       *kvbm.Worker
	stores   []Storage
	bs       int
	pending  map[uint64]*kvbm.Metadata // built, not yet bound
	staged   map[kvbm.DeviceBlockID]int32
	free     []int32
	bindings []binding
	// With piece-by-piece staging kvbm moves host-tier blocks through
	// ReadBlock/WriteBlock and other tiers' through scratch; a written one
	// goes to staging slot scratchSlot (≥ 0) at the next call into the
	// device or the end of the step's loads.
	scratch     []byte
	scratchSlot int32
	protoErrs   uint64
	stageDrops  uint64

	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
	closed bool
	sink   atomic.Pointer[func([]kv.Event)]
}

// SetEventSink installs where the tiers' KV events go (nil drops them);
// it is called with the server's lock held, from whichever connection's
// call moved the blocks.
func (s *Server) SetEventSink(f func([]kv.Event)) {
	if f == nil {
		s.sink.Store(nil)
		return
	}
	s.sink.Store(&f)
}

func (s *Server) emit(batch []kv.Event) {
	if f := s.sink.Load(); f != nil {
		(*f)(batch)
	}
}

// binding is one bound step's staging slots, freed at the first
// GetFinished after its stores were saved.
type binding struct {
	iter    uint64
	slots   []int32
	devs    []kvbm.DeviceBlockID
	unsaved bool
}

// Listen creates the socket (refusing one a live sidecar serves; a stale
// one is replaced) and returns a server not yet serving.
func Listen(cfg Config) (*Server, error) {
	if cfg.Socket == "" {
		return nil, errors.New("sidecar: no socket path")
	}
	if cfg.HostBlocks <= 0 && cfg.DiskBlocks <= 0 {
		return nil, errors.New("sidecar: give host or disk blocks")
	}
	if cfg.StagingBlocks <= 0 {
		return nil, fmt.Errorf("sidecar: %d staging blocks, want > 0", cfg.StagingBlocks)
	}
	if cfg.DiskBlocks > 0 && cfg.OpenDisk == nil {
		return nil, errors.New("sidecar: disk blocks without a disk opener")
	}
	if cfg.ShmDir == "" {
		cfg.ShmDir = "/dev/shm"
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if fi, err := os.Lstat(cfg.Socket); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("sidecar: %s exists and is not a socket", cfg.Socket)
		}
		if c, err := net.DialTimeout("unix", cfg.Socket, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("sidecar: %s is served by another process", cfg.Socket)
		}
		if err := os.Remove(cfg.Socket); err != nil {
			return nil, fmt.Errorf("sidecar: stale socket: %w", err)
		}
	}
	removeStaleArenas(cfg.ShmDir, cfg.Name, cfg.Logger)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: cfg.Socket, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("sidecar: %w", err)
	}
	if err := os.Chmod(cfg.Socket, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("sidecar: %w", err)
	}
	return &Server{cfg: cfg, ln: ln, log: cfg.Logger, pending: map[uint64]*kvbm.Metadata{},
		staged: map[kvbm.DeviceBlockID]int32{}, conns: map[net.Conn]struct{}{}}, nil
}

// Addr is the socket's path.
func (s *Server) Addr() string { return s.cfg.Socket }

// Serve accepts connections until Close.
func (s *Server) Serve() error {
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			return err
		}
		if err := checkPeer(c); err != nil {
			s.log.Warn("kvbm sidecar: connection refused", "err", err)
			c.Close()
			continue
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return nil
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(c)
	}
}

// checkPeer admits only processes of this user, and root (which the
// socket's mode does not stop either: an engine container often runs as
// root beside a non-root worker). The mode keeps others out; this closes
// the window between bind and chmod.
func checkPeer(c *net.UnixConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *syscall.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return cerr
	}
	if int(cred.Uid) != os.Getuid() && cred.Uid != 0 {
		return fmt.Errorf("peer uid %d, this sidecar runs as %d", cred.Uid, os.Getuid())
	}
	return nil
}

// Close stops serving, closes every connection, the tiers and the arena
// (its file is removed).
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.stores {
		err = errors.Join(err, st.Close())
	}
	return errors.Join(err, s.arena.close())
}

func (s *Server) serveConn(c net.Conn) {
	defer func() {
		c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		s.wg.Done()
	}()
	r := bufio.NewReader(c)
	var hdr [HeaderSize]byte
	var out []byte
	cs := &connState{}
	for {
		c.SetReadDeadline(time.Time{}) // idle between calls is fine
		if _, err := r.Peek(1); err != nil {
			return
		}
		c.SetReadDeadline(time.Now().Add(s.cfg.Timeout))
		kind, payload, err := readFrame(r, &hdr)
		var reply any
		rkind := KindReply
		var fe *frameError
		switch {
		case errors.As(err, &fe):
			s.countProtoErr()
			s.writeReply(c, out[:0], KindError, errorReply{Code: "bad_frame", Error: fe.msg})
			return // out of step: nothing after it can be trusted
		case err != nil:
			return
		case kind != KindRequest:
			s.countProtoErr()
			reply, rkind = errorReply{Code: "bad_frame", Error: fmt.Sprintf("frame kind %d, want a request (%d)", kind, KindRequest)}, KindError
		default:
			reply, err = s.handle(cs, payload)
			if err != nil {
				code := "failed"
				var be *badRequest
				if errors.As(err, &be) {
					code = be.code
					s.countProtoErr()
				}
				reply, rkind = errorReply{Code: code, Error: err.Error()}, KindError
			}
		}
		if out, err = s.writeReply(c, out[:0], rkind, reply); err != nil {
			return
		}
	}
}

func (s *Server) writeReply(c net.Conn, buf []byte, kind byte, v any) ([]byte, error) {
	buf, err := appendFrame(buf, kind, v)
	if err != nil {
		buf, _ = appendFrame(buf[:0], KindError, errorReply{Code: "failed", Error: err.Error()})
	}
	c.SetWriteDeadline(time.Now().Add(s.cfg.Timeout))
	_, err = c.Write(buf)
	return buf, err
}

func (s *Server) countProtoErr() {
	s.mu.Lock()
	s.protoErrs++
	s.mu.Unlock()
}

// badRequest is the client's fault (counted, named by code); other errors
// are the connector refusing a call.
type badRequest struct {
	code string
	err  error
}

func (e *badRequest) Error() string { return e.err.Error() }

func bad(format string, a ...any) error {
	return &badRequest{code: "bad_request", err: fmt.Errorf(format, a...)}
}

// connState is what a connection said in its hello.
type connState struct {
	shape string // vllm or trtllm
}

func (s *Server) handle(cs *connState, payload []byte) (any, error) {
	var q request
	if err := json.Unmarshal(payload, &q); err != nil {
		return nil, bad("payload: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if q.Op == "hello" {
		switch q.Shape {
		case "vllm", "trtllm":
		default:
			return nil, bad("hello: shape %q, want vllm or trtllm", q.Shape)
		}
		cs.shape = q.Shape
		r := helloReply{Version: Version, Registered: s.mgr != nil, BlockSize: s.bs}
		if s.arena != nil {
			r.Arena = s.arena.path
		}
		return r, nil
	}
	if !knownOps[q.Op] {
		return nil, bad("unknown op %q", q.Op)
	}
	if cs.shape == "" {
		return nil, bad("%s before hello", q.Op)
	}
	switch q.Op {
	case "register":
		return s.register(&q)
	case "stats":
		return s.stats(q.Slot), nil
	}
	if s.mgr == nil {
		return nil, &badRequest{code: "not_registered", err: fmt.Errorf("%s: the engine's worker has not registered its KV cache", q.Op)}
	}
	switch q.Op {
	case "match":
		if q.Req == nil || q.Req.ID == "" {
			return nil, bad("match: no req.id")
		}
		if q.NumComputed < 0 {
			return nil, bad("match: num_computed %d", q.NumComputed)
		}
		var n int
		var async bool
		var err error
		if cs.shape == "vllm" {
			n, async, err = s.vllm.GetNumNewMatchedTokens(q.Req.request(), q.NumComputed)
		} else {
			n, async, err = s.trt.GetNumNewMatchedTokens(q.Req.request(), q.NumComputed)
		}
		return matchReply{Tokens: n, Async: async}, err
	case "alloc":
		if q.ID == "" {
			return nil, bad("alloc: no id")
		}
		var err error
		if cs.shape == "vllm" {
			err = s.vllm.UpdateStateAfterAlloc(q.ID, q.BlockIDs, q.NumExternal)
		} else {
			err = s.trt.UpdateStateAfterAlloc(q.ID, q.BlockIDs, q.ContextPosition)
		}
		return struct{}{}, err
	case "build":
		return s.build(cs.shape, &q)
	case "finished":
		if q.ID == "" {
			return nil, bad("finished: no id")
		}
		if cs.shape == "vllm" {
			return finishedReply{Delay: s.vllm.RequestFinished(q.ID, q.BlockIDs)}, nil
		}
		return finishedReply{Delay: s.trt.RequestFinished(q.ID, q.BlockIDs)}, nil
	case "bind":
		return s.bind(q.Iteration)
	case "saved":
		return s.saved(q.Iteration)
	case "get_finished":
		return s.getFinished()
	}
	return nil, bad("unknown op %q", q.Op)
}

var knownOps = map[string]bool{"hello": true, "register": true, "stats": true, "match": true, "alloc": true,
	"build": true, "finished": true, "bind": true, "saved": true, "get_finished": true}

func (s *Server) register(q *request) (any, error) {
	if q.BlockBytes <= 0 || q.BlockSize <= 0 {
		return nil, bad("register: block_bytes %d, block_size %d, want both > 0", q.BlockBytes, q.BlockSize)
	}
	if s.cfg.BlockSize > 0 && q.BlockSize != s.cfg.BlockSize {
		return nil, bad("register: block_size %d, the engine serves %d-token blocks", q.BlockSize, s.cfg.BlockSize)
	}
	if s.mgr != nil {
		// A restarted engine worker: the same arena if it is the same shape.
		if q.BlockBytes != s.arena.bb || q.BlockSize != s.bs {
			return nil, bad("register: %d-byte %d-token blocks, registered %d-byte %d-token ones", q.BlockBytes, q.BlockSize, s.arena.bb, s.bs)
		}
		if !slices.Equal(q.PieceBytes, s.arena.pieces) {
			return nil, bad("register: staging layout %v, the arena has %v", q.PieceBytes, s.arena.pieces)
		}
		return s.registered(), nil
	}
	align := DefaultStagingAlign
	if q.StagingAlign != nil {
		align = *q.StagingAlign
	}
	if err := validLayout(q.BlockBytes, q.PieceBytes, align); err != nil {
		return nil, bad("register: %v", err)
	}
	if err := s.open(q.BlockBytes, q.BlockSize, q.PieceBytes, align); err != nil {
		return nil, err
	}
	s.log.Info("kvbm sidecar: engine KV cache registered", "block_bytes", q.BlockBytes, "block_size", q.BlockSize,
		"device_blocks", q.DeviceBlocks, "arena", s.arena.path, "host_blocks", s.cfg.HostBlocks, "disk_blocks", s.cfg.DiskBlocks,
		"staging_pieces", len(s.arena.pieces), "staging_offset", s.arena.stagingOff)
	return s.registered(), nil
}

func (s *Server) registered() registerReply {
	a := s.arena
	return registerReply{Arena: a.path, ArenaBytes: len(a.mem), BlockBytes: a.bb, HostSlots: a.hostSlots,
		StagingOffset: a.stagingOff, StagingSlots: a.staging, PieceBytes: append([]int{}, a.pieces...)}
}

// open builds the arena (staged piece by piece when pieces is given), the
// tiers and the connector for bb-byte blocks.
func (s *Server) open(bb, bs int, pieces []int, align int) (err error) {
	name := fmt.Sprintf("%s-%d.arena", s.cfg.Name, os.Getpid())
	a, err := createArena(s.cfg.ShmDir, name, bb, max(s.cfg.HostBlocks, 0), s.cfg.StagingBlocks, pieces, align)
	if err != nil {
		return fmt.Errorf("register: arena: %w", err)
	}
	var stores []Storage
	defer func() {
		if err != nil {
			for _, st := range stores {
				st.Close()
			}
			a.close()
		}
	}()
	mc := kvbm.Config{BlockSize: bs, BlockBytes: bb, DiskFilter: s.cfg.DiskFilter, Worker: s.cfg.Worker, Events: s.emit}
	if s.cfg.HostBlocks > 0 {
		h, err := kvbm.NewHostArenaOver(a.host(), s.cfg.HostBlocks, bb)
		if err != nil {
			return err
		}
		mc.Host = h
	}
	reopened := false
	if s.cfg.DiskBlocks > 0 {
		d, re, err := s.cfg.OpenDisk(s.cfg.DiskBlocks, bb)
		if err != nil {
			return fmt.Errorf("register: disk tier: %w", err)
		}
		stores, mc.Disk, reopened = append(stores, d), d, re
	}
	if s.cfg.OpenObject != nil && s.cfg.ObjectBlocks > 0 {
		o, err := s.cfg.OpenObject(s.cfg.ObjectBlocks, bb)
		if err != nil {
			return fmt.Errorf("register: object tier: %w", err)
		}
		stores, mc.Object = append(stores, o), o
	}
	m, err := kvbm.NewManager(mc)
	if err != nil {
		return err
	}
	if reopened {
		if n, corrupt, err := m.RecoverDisk(); err != nil {
			return fmt.Errorf("register: disk recovery: %w", err)
		} else {
			s.log.Info("kvbm sidecar: disk tier recovered", "blocks", n, "corrupt_dropped", corrupt)
		}
	}
	if mc.Object != nil {
		if n, corrupt, err := m.RecoverObject(); err != nil {
			return fmt.Errorf("register: object recovery: %w", err)
		} else if n+corrupt > 0 {
			s.log.Info("kvbm sidecar: object tier recovered", "blocks", n, "corrupt_dropped", corrupt)
		}
	}
	c := kvbm.NewConnector(m)
	if s.cfg.RecomputePerToken > 0 {
		var per [kv.NumTiers]time.Duration
		for t, bw := range s.cfg.Bandwidth {
			if bw > 0 {
				per[t] = time.Duration(float64(bb) / bw * float64(time.Second))
			}
		}
		c.SetLoadCost(kvbm.LoadCost{PerBlock: per, RecomputeToken: s.cfg.RecomputePerToken}, nil)
	}
	s.arena, s.stores, s.mgr, s.conn, s.bs = a, stores, m, c, bs
	s.vllm, s.trt, s.wk = c.VLLMLeader(), c.TRTLLMLeader(), c.Worker(stagingDevice{s})
	s.scratch, s.scratchSlot = nil, -1
	if a.pieces != nil {
		s.scratch = make([]byte, bb)
	}
	s.free = make([]int32, a.staging)
	for i := range s.free {
		s.free[i] = int32(a.staging - 1 - i)
	}
	return nil
}

func (s *Server) build(shape string, q *request) (any, error) {
	for id, n := range q.NumScheduled {
		if n < 0 {
			return nil, bad("build: num_scheduled[%q] = %d", id, n)
		}
	}
	var md *kvbm.Metadata
	var err error
	if shape == "vllm" {
		out := &kvbm.VLLMSchedulerOutput{NumScheduledTokens: q.NumScheduled}
		for _, r := range q.New {
			if r.Req == nil || r.Req.ID == "" {
				return nil, bad("build: a new request without req.id")
			}
			out.NewRequests = append(out.NewRequests, kvbm.VLLMNewRequest{Req: r.Req.request(), BlockIDs: r.BlockIDs, NumComputedTokens: r.NumComputed})
		}
		for _, r := range q.Cached {
			out.CachedRequests = append(out.CachedRequests, kvbm.VLLMCachedRequest{ID: r.ID, ResumedFromPreemption: r.Resumed,
				NewTokenIDs: r.NewTokenIDs, NewBlockIDs: r.NewBlockIDs, NumComputedTokens: r.NumComputed})
		}
		md, err = s.vllm.BuildConnectorMeta(out)
	} else {
		out := &kvbm.TRTLLMSchedulerOutput{NumScheduledTokens: q.NumScheduled}
		for _, r := range q.New {
			out.NewRequests = append(out.NewRequests, kvbm.TRTLLMRequestData{ID: r.ID, NewTokens: r.NewTokens,
				NewBlockIDs: r.NewBlockIDs, ComputedPosition: r.ComputedPosition, Req: r.Req.request()})
		}
		for _, r := range q.Cached {
			out.CachedRequests = append(out.CachedRequests, kvbm.TRTLLMRequestData{ID: r.ID, NewTokens: r.NewTokens,
				NewBlockIDs: r.NewBlockIDs, ComputedPosition: r.ComputedPosition})
		}
		md, err = s.trt.BuildConnectorMeta(out)
	}
	if err != nil {
		return nil, err
	}
	r := buildReply{Iteration: md.Iteration}
	for _, op := range md.Ops {
		if op.Kind == kvbm.OpLoad {
			r.Loads++
		} else {
			r.Stores++
		}
	}
	if len(md.Ops) > 0 {
		// A step without ops is not bound: the worker skips the call.
		s.pending[md.Iteration] = md
	}
	return r, nil
}

// stagingDevice is the engine's device as kvbm's worker sees it: each
// device block of a bound step is the staging slot assigned to it, which
// the engine's worker fills (stores) or empties (loads). kvbm copies a
// block between a host tier slot and the staging slot with ReadBlock and
// WriteBlock (kvbm.PieceDevice); for the disk and object tiers it uses
// views: with whole-block staging the slot itself, with piece-by-piece
// staging the server's scratch block, gathered from the slot's pieces
// (read) or scattered to them at the next call (write): kvbm uses a view
// only until its next call into the device.
type stagingDevice struct{ s *Server }

func (d stagingDevice) slot(id kvbm.DeviceBlockID) (int, error) {
	d.s.flushScratch()
	slot, ok := d.s.staged[id]
	if !ok {
		return 0, fmt.Errorf("device block %d has no staging slot", id)
	}
	return int(slot), nil
}

func (d stagingDevice) ReadView(id kvbm.DeviceBlockID) ([]byte, error) {
	slot, err := d.slot(id)
	if err != nil {
		return nil, err
	}
	a := d.s.arena
	if a.pieces == nil {
		return a.stagingSlot(slot), nil
	}
	a.readSlot(slot, d.s.scratch)
	return d.s.scratch, nil
}

func (d stagingDevice) WriteView(id kvbm.DeviceBlockID) ([]byte, error) {
	slot, err := d.slot(id)
	if err != nil {
		return nil, err
	}
	a := d.s.arena
	if a.pieces == nil {
		return a.stagingSlot(slot), nil
	}
	d.s.scratchSlot = int32(slot)
	return d.s.scratch, nil
}

// ReadBlock (kvbm.PieceDevice): the block's staging slot straight into a
// host tier slot, hashed as it passes (from cache, just read).
func (d stagingDevice) ReadBlock(id kvbm.DeviceBlockID, dst []byte) (uint64, error) {
	slot, err := d.slot(id)
	if err != nil {
		return 0, err
	}
	a := d.s.arena
	if len(dst) != a.bb {
		return 0, fmt.Errorf("a %d-byte destination for %d-byte blocks", len(dst), a.bb)
	}
	if a.pieces == nil {
		src := a.stagingSlot(slot)
		streamcopy.Copy(dst, src)
		return kv.Checksum(src), nil
	}
	return a.readSlotHashed(slot, dst), nil
}

// WriteBlock (kvbm.PieceDevice): a host tier slot's block into its
// staging slot.
func (d stagingDevice) WriteBlock(id kvbm.DeviceBlockID, src []byte) error {
	slot, err := d.slot(id)
	if err != nil {
		return err
	}
	a := d.s.arena
	if len(src) != a.bb {
		return fmt.Errorf("a %d-byte block for %d-byte blocks", len(src), a.bb)
	}
	if a.pieces == nil {
		streamcopy.Copy(a.stagingSlot(slot), src)
	} else {
		a.writeSlot(slot, src)
	}
	return nil
}

// flushScratch puts a block kvbm wrote into the scratch view into its
// staging slot.
func (s *Server) flushScratch() {
	if s.scratchSlot >= 0 {
		s.arena.writeSlot(int(s.scratchSlot), s.scratch)
		s.scratchSlot = -1
	}
}

// bind assigns staging slots to a built step's device blocks and runs its
// loads (tier → staging, verified); the engine's worker then copies them
// onto the device, and saves the step's stores into their slots.
func (s *Server) bind(iter uint64) (any, error) {
	md, ok := s.pending[iter]
	if !ok {
		return nil, bad("bind: iteration %d was not built here (or is bound already)", iter)
	}
	delete(s.pending, iter)
	b := binding{iter: iter}
	var r bindReply
	assign := func(op *kvbm.Op, ids []kvbm.DeviceBlockID) transfer {
		t := transfer{Request: op.Request}
		for _, id := range ids {
			slot, ok := s.staged[id]
			if !ok {
				n := len(s.free)
				if n == 0 {
					// Its copy fails in kvbm: a load error (recomputed) or
					// a block left uncached.
					s.stageDrops++
					continue
				}
				slot = s.free[n-1]
				s.free = s.free[:n-1]
				s.staged[id] = slot
				b.slots, b.devs = append(b.slots, slot), append(b.devs, id)
			}
			t.Device, t.Slots = append(t.Device, id), append(t.Slots, slot)
		}
		return t
	}
	for i := range md.Ops {
		op := &md.Ops[i]
		if op.Kind == kvbm.OpLoad {
			r.Loads = append(r.Loads, assign(op, op.Into))
			continue
		}
		ids := make([]kvbm.DeviceBlockID, len(op.Store))
		for j, sb := range op.Store {
			ids[j] = sb.Device
		}
		r.Stores = append(r.Stores, assign(op, ids))
		b.unsaved = true
	}
	s.bindings = append(s.bindings, b)
	err := s.wk.BindConnectorMetadata(md)
	s.flushScratch()
	r.LoadErrors = s.wk.BlockIDsWithLoadErrors()
	if r.Loads == nil {
		r.Loads = []transfer{}
	}
	if r.Stores == nil {
		r.Stores = []transfer{}
	}
	if err != nil {
		// The loads that failed are in LoadErrors; the engine recomputes.
		s.log.Warn("kvbm sidecar: load", "iteration", iter, "err", err)
	}
	return r, nil
}

// saved is the engine's worker having copied the bound steps' stores into
// their staging slots (the forward pass is done).
func (s *Server) saved(iter uint64) (any, error) {
	s.wk.WaitForSave()
	for i := range s.bindings {
		if s.bindings[i].iter <= iter {
			s.bindings[i].unsaved = false
		}
	}
	return struct{}{}, nil
}

// getFinished runs the saved stores (staging → tiers, checksummed) and
// frees the staging slots of every step that is done with them.
func (s *Server) getFinished() (any, error) {
	sending, recving, err := s.wk.GetFinished()
	if err != nil {
		s.log.Warn("kvbm sidecar: store", "err", err)
	}
	keep := s.bindings[:0]
	for _, b := range s.bindings {
		if b.unsaved {
			keep = append(keep, b)
			continue
		}
		// Back onto the stack in reverse, so the next step pops them in
		// the order this one got them: a request's blocks then sit in
		// ascending slots, which the Python worker copies as one run.
		for i := len(b.devs) - 1; i >= 0; i-- {
			id := b.devs[i]
			if s.staged[id] == b.slots[i] {
				delete(s.staged, id)
			}
			s.free = append(s.free, b.slots[i])
		}
	}
	s.bindings = keep
	if sending == nil {
		sending = []string{}
	}
	if recving == nil {
		recving = []string{}
	}
	return getFinishedReply{Sending: sending, Recving: recving}, nil
}

func (s *Server) stats(slot string) statsReply {
	r := statsReply{Registered: s.mgr != nil, ProtocolErrors: s.protoErrs, StagingDropped: s.stageDrops}
	if s.mgr == nil {
		return r
	}
	r.Stats, r.Slots = s.mgr.Stats(), s.conn.Slots()
	if slot != "" {
		if si, ok := s.conn.Slot(slot); ok {
			r.Slot = &wireSlotInfo{Phase: si.Phase.String(), Tokens: si.Tokens, DeviceBlocks: si.DeviceBlocks, Current: si.Current,
				Evaluated: si.Evaluated, Pending: si.Pending, LoadedHost: si.LoadedHost, LoadedDisk: si.LoadedDisk, LoadedObject: si.LoadedObject}
		}
	}
	return r
}

// Stats is the manager's totals (zero before registration) and the
// protocol errors counted.
func (s *Server) Stats() (kvbm.Stats, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mgr == nil {
		return kvbm.Stats{}, s.protoErrs
	}
	return s.mgr.Stats(), s.protoErrs
}
