package sidecar

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

const (
	testBB = 256 // block bytes
	testBS = 4   // tokens per block
)

func startServer(t *testing.T, cfg Config) *Server {
	t.Helper()
	dir := t.TempDir()
	if cfg.Socket == "" {
		cfg.Socket = filepath.Join(dir, "kvbm.sock")
	}
	cfg.ShmDir, cfg.Name = dir, "test"
	if cfg.HostBlocks == 0 {
		cfg.HostBlocks = 8
	}
	if cfg.StagingBlocks == 0 {
		cfg.StagingBlocks = 4
	}
	s, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return s
}

type client struct {
	t *testing.T
	c net.Conn
}

func dial(t *testing.T, s *Server) *client {
	t.Helper()
	c, err := net.Dial("unix", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return &client{t, c}
}

// raw sends b and reads one frame back.
func (c *client) raw(b []byte) (byte, map[string]any) {
	c.t.Helper()
	if _, err := c.c.Write(b); err != nil {
		c.t.Fatal(err)
	}
	var hdr [HeaderSize]byte
	kind, payload, err := readFrame(c.c, &hdr)
	if err != nil {
		c.t.Fatalf("reading the reply: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(payload, &m); err != nil {
		c.t.Fatalf("reply %q: %v", payload, err)
	}
	return kind, m
}

func (c *client) call(req map[string]any) (byte, map[string]any) {
	c.t.Helper()
	b, err := appendFrame(nil, KindRequest, req)
	if err != nil {
		c.t.Fatal(err)
	}
	return c.raw(b)
}

// ok calls and fails the test on an error frame, decoding the reply into out.
func (c *client) ok(req map[string]any, out any) {
	c.t.Helper()
	kind, m := c.call(req)
	if kind != KindReply {
		c.t.Fatalf("%v: %v", req["op"], m)
	}
	if out != nil {
		b, _ := json.Marshal(m)
		if err := json.Unmarshal(b, out); err != nil {
			c.t.Fatal(err)
		}
	}
}

func (c *client) wantError(req map[string]any, code string) {
	c.t.Helper()
	kind, m := c.call(req)
	if kind != KindError || m["code"] != code {
		c.t.Fatalf("%v: got kind %d %v, want error %q", req["op"], kind, m, code)
	}
}

func frame(magic string, version, kind byte, payload []byte) []byte {
	b := append([]byte(magic), version, kind, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(b[4:], uint32(len(payload)))
	return append(b, payload...)
}

// Every malformed input is answered with an error frame and counted; a
// framing fault closes that connection, anything else leaves it usable,
// and the server keeps serving other connections.
func TestMalformedFrames(t *testing.T) {
	s := startServer(t, Config{})
	for _, tc := range []struct {
		name  string
		frame []byte
		close bool
	}{
		{"bad magic", frame("XX", Version, KindRequest, []byte(`{}`)), true},
		{"bad version", frame("KB", 9, KindRequest, []byte(`{}`)), true},
		{"huge length", func() []byte {
			b := frame("KB", Version, KindRequest, nil)
			binary.BigEndian.PutUint32(b[4:], MaxPayload+1)
			return b
		}(), true},
		{"reply kind", frame("KB", Version, KindReply, []byte(`{}`)), false},
		{"not json", frame("KB", Version, KindRequest, []byte(`{"op":`)), false},
		{"json array", frame("KB", Version, KindRequest, []byte(`[1,2]`)), false},
		{"before hello", frame("KB", Version, KindRequest, []byte(`{"op":"match"}`)), false},
		{"bad shape", frame("KB", Version, KindRequest, []byte(`{"op":"hello","shape":"tgi"}`)), false},
		{"wrong field type", frame("KB", Version, KindRequest, []byte(`{"op":"hello","shape":7}`)), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, s)
			kind, m := c.raw(tc.frame)
			if kind != KindError || m["error"] == "" {
				t.Fatalf("got kind %d %v, want an error frame", kind, m)
			}
			c.c.SetReadDeadline(time.Now().Add(2 * time.Second))
			if tc.close {
				if _, err := c.c.Read(make([]byte, 1)); err == nil {
					t.Fatal("the connection stayed open after a framing fault")
				}
				return
			}
			c.ok(map[string]any{"op": "hello", "shape": "vllm"}, nil) // still in step
		})
	}
	// A truncated frame (the peer hangs up mid-payload) only ends its
	// connection.
	c := dial(t, s)
	c.c.Write(frame("KB", Version, KindRequest, []byte(`{"op":"hello"}`))[:12])
	c.c.Close()
	c2 := dial(t, s)
	c2.ok(map[string]any{"op": "hello", "shape": "trtllm"}, nil)
	c2.wantError(map[string]any{"op": "match", "req": map[string]any{"id": "a", "tokens": []int{1}}}, "not_registered")
	c2.wantError(map[string]any{"op": "frobnicate"}, "bad_request")
	c2.wantError(map[string]any{"op": "register", "block_bytes": -1, "block_size": 4}, "bad_request")
	_, perr := s.Stats()
	if perr < 10 {
		t.Fatalf("%d protocol errors counted, want every malformed frame", perr)
	}
}

func TestSocketMode(t *testing.T) {
	s := startServer(t, Config{})
	fi, err := os.Stat(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want 0600", fi.Mode().Perm())
	}
	// A second server on the same path is refused while the first serves.
	if _, err := Listen(Config{Socket: s.Addr(), HostBlocks: 1, StagingBlocks: 1}); err == nil {
		t.Fatal("a second server took a live socket")
	}
}

// arenaView maps the arena as the engine's worker does.
func arenaView(t *testing.T, reg registerReply) []byte {
	t.Helper()
	f, err := os.OpenFile(reg.Arena, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	if fi.Mode().Perm() != 0o600 || int(fi.Size()) != reg.ArenaBytes {
		t.Fatalf("arena %v, %d bytes; want 0600, %d", fi.Mode().Perm(), fi.Size(), reg.ArenaBytes)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, reg.ArenaBytes, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(mem) })
	if string(mem[:8]) != arenaMagic || binary.LittleEndian.Uint64(mem[16:]) != uint64(reg.BlockBytes) {
		t.Fatalf("arena header %q", mem[:24])
	}
	return mem
}

// One request's blocks offloaded through the staging slots come back,
// byte for byte, into another request's device blocks (vLLM's sequence),
// with the staging slots laid out block by block (a worker that names no
// pieces) and piece by piece.
func TestRoundTripVLLM(t *testing.T) {
	t.Run("blocks", func(t *testing.T) { roundTripVLLM(t, nil, nil) })
	align := 1040
	t.Run("pieces", func(t *testing.T) { roundTripVLLM(t, []int{64, 128, 64}, &align) })
}

func roundTripVLLM(t *testing.T, pieces []int, align *int) {
	s := startServer(t, Config{BlockSize: testBS})
	sch, wk := dial(t, s), dial(t, s)
	sch.ok(map[string]any{"op": "hello", "shape": "vllm", "role": "scheduler"}, nil)
	wk.ok(map[string]any{"op": "hello", "shape": "vllm", "role": "worker"}, nil)
	wk.wantError(map[string]any{"op": "register", "block_bytes": testBB, "block_size": 8}, "bad_request")
	wk.wantError(map[string]any{"op": "register", "block_bytes": testBB, "block_size": testBS, "piece_bytes": []int{64, 64}}, "bad_request")
	wk.wantError(map[string]any{"op": "register", "block_bytes": testBB, "block_size": testBS, "staging_align": 4096}, "bad_request")
	regReq := map[string]any{"op": "register", "block_bytes": testBB, "block_size": testBS, "device_blocks": 16}
	if pieces != nil {
		regReq["piece_bytes"] = pieces
	}
	if align != nil {
		regReq["staging_align"] = *align
	}
	var reg registerReply
	wk.ok(regReq, &reg)
	mem := arenaView(t, reg)
	wantAlign := DefaultStagingAlign
	if align != nil {
		wantAlign = *align
	}
	version := binary.LittleEndian.Uint64(mem[8:])
	if reg.StagingOffset%arenaPage != wantAlign || int(binary.LittleEndian.Uint64(mem[48:])) != reg.StagingOffset ||
		!slices.Equal(reg.PieceBytes, pieces) || (version == 2) != (pieces != nil) {
		t.Fatalf("register: %+v, arena version %d; want staging %d past a page, pieces %v", reg, version, wantAlign, pieces)
	}
	// A restarted worker gets the same arena if it asks for the same layout.
	var again registerReply
	wk.ok(regReq, &again)
	if again.Arena != reg.Arena {
		t.Fatalf("re-register: arena %s, want %s", again.Arena, reg.Arena)
	}
	if pieces != nil {
		wk.wantError(map[string]any{"op": "register", "block_bytes": testBB, "block_size": testBS}, "bad_request")
		for i, n := range pieces {
			if got := binary.LittleEndian.Uint64(mem[64+8*i:]); got != uint64(n) {
				t.Fatalf("arena header: piece %d has %d bytes, want %d", i, got, n)
			}
		}
	}
	// slot reads (nil b) or writes staging slot i's block as the worker
	// lays it out.
	slot := func(i int32, b []byte) []byte {
		if pieces == nil {
			s := mem[reg.StagingOffset+int(i)*testBB:][:testBB]
			copy(s, b)
			return s
		}
		var out []byte
		off := reg.StagingOffset
		for _, n := range pieces {
			piece := mem[off+int(i)*n:][:n]
			if b != nil {
				b = b[copy(piece, b):]
			}
			out = append(out, piece...)
			off += reg.StagingSlots * n
		}
		return out
	}

	prompt := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	req := map[string]any{"id": "a", "tokens": prompt}
	var mr matchReply
	sch.ok(map[string]any{"op": "match", "req": req, "num_computed": 0}, &mr)
	if mr.Tokens != 0 {
		t.Fatalf("empty tiers matched %d tokens", mr.Tokens)
	}
	sch.ok(map[string]any{"op": "alloc", "id": "a", "block_ids": []int{5, 6, 7}, "num_external": 0}, nil)
	var br buildReply
	sch.ok(map[string]any{"op": "build", "new": []map[string]any{{"req": req, "block_ids": []int{5, 6, 7}, "num_computed": 0}},
		"num_scheduled": map[string]int{"a": 10}}, &br)
	if br.Stores != 1 || br.Loads != 0 {
		t.Fatalf("build: %+v, want one store op", br)
	}
	var bind bindReply
	wk.ok(map[string]any{"op": "bind", "iteration": br.Iteration}, &bind)
	if len(bind.Stores) != 1 || len(bind.Stores[0].Device) != 2 || bind.Stores[0].Device[0] != 5 || bind.Stores[0].Device[1] != 6 {
		t.Fatalf("bind: %+v, want blocks 5 and 6 stored", bind)
	}
	blocks := map[int32][]byte{}
	for i, d := range bind.Stores[0].Device {
		b := make([]byte, testBB) // no two pieces alike: a misplaced piece shows
		for j := range b {
			b[j] = byte(int(d)*37 + i*11 + j*3 + j/64)
		}
		blocks[int32(d)] = b
		slot(bind.Stores[0].Slots[i], b) // the forward pass's KV
	}
	wk.ok(map[string]any{"op": "saved", "iteration": br.Iteration}, nil)
	var gf getFinishedReply
	wk.ok(map[string]any{"op": "get_finished"}, &gf)
	var st statsReply
	sch.ok(map[string]any{"op": "stats", "slot": "a"}, &st)
	if st.Stats.OffloadedHost != 2 || st.Stats.HostBlocks != 2 || st.Slot == nil || st.Slot.Evaluated != 2 {
		t.Fatalf("after the store: %+v slot %+v", st.Stats, st.Slot)
	}
	// The host tier holds whole blocks whatever the staging layout.
	for d, b := range blocks {
		if !bytes.Contains(mem[arenaDataOff:arenaDataOff+reg.HostSlots*testBB], b) {
			t.Fatalf("device block %d's bytes are not a whole block in the host tier", d)
		}
	}
	var fr finishedReply
	sch.ok(map[string]any{"op": "finished", "id": "a", "block_ids": []int{5, 6, 7}}, &fr)
	if fr.Delay {
		t.Fatal("a request with nothing in flight delayed its free")
	}

	// The same prompt again: both full blocks match (the whole prompt is
	// not covered, 2 tokens are left to compute) and load into 1 and 2.
	req["id"] = "b"
	sch.ok(map[string]any{"op": "match", "req": req, "num_computed": 0}, &mr)
	if mr.Tokens != 8 || !mr.Async {
		t.Fatalf("match: %+v, want 8 tokens async", mr)
	}
	sch.ok(map[string]any{"op": "alloc", "id": "b", "block_ids": []int{1, 2}, "num_external": 8}, nil)
	sch.ok(map[string]any{"op": "build", "num_scheduled": map[string]int{}}, &br)
	if br.Loads != 1 {
		t.Fatalf("build: %+v, want one load", br)
	}
	wk.ok(map[string]any{"op": "bind", "iteration": br.Iteration}, &bind)
	if len(bind.Loads) != 1 || len(bind.LoadErrors) != 0 {
		t.Fatalf("bind: %+v", bind)
	}
	// The slots the first step freed come back in ascending order, so the
	// worker copies the two blocks as one run.
	if sl := bind.Loads[0].Slots; len(sl) != 2 || sl[1] != sl[0]+1 {
		t.Fatalf("load slots %v, want two ascending consecutive slots", sl)
	}
	for i, d := range bind.Loads[0].Device {
		want := blocks[int32(5+i)]
		if got := slot(bind.Loads[0].Slots[i], nil); !bytes.Equal(got, want) {
			t.Fatalf("device block %d: staged bytes differ from what block %d stored", d, 5+i)
		}
	}
	wk.wantError(map[string]any{"op": "bind", "iteration": br.Iteration}, "bad_request") // bound already
	wk.ok(map[string]any{"op": "saved", "iteration": br.Iteration}, nil)
	wk.ok(map[string]any{"op": "get_finished"}, &gf)
	if len(gf.Recving) != 1 || gf.Recving[0] != "b" {
		t.Fatalf("get_finished: %+v, want b received", gf)
	}
	sch.ok(map[string]any{"op": "stats", "slot": "b"}, &st)
	if st.Stats.OnboardedHost != 2 || st.Slot.LoadedHost != 8 {
		t.Fatalf("after the load: %+v slot %+v", st.Stats, st.Slot)
	}
}

// More device blocks in a step than staging slots: the excess store is
// dropped and counted, nothing crashes, and the slots come back.
func TestStagingExhausted(t *testing.T) {
	s := startServer(t, Config{StagingBlocks: 1})
	c := dial(t, s)
	c.ok(map[string]any{"op": "hello", "shape": "trtllm"}, nil)
	c.ok(map[string]any{"op": "register", "block_bytes": testBB, "block_size": testBS}, nil)
	toks := []int{1, 2, 3, 4, 5, 6, 7, 8, 9}
	var mr matchReply
	c.ok(map[string]any{"op": "match", "req": map[string]any{"id": "r", "tokens": toks}, "num_computed": 0}, &mr)
	c.ok(map[string]any{"op": "alloc", "id": "r", "block_ids": []int{0, 1, 2}, "context_position": 0}, nil)
	var br buildReply
	c.ok(map[string]any{"op": "build", "new": []map[string]any{{"id": "r", "new_tokens": toks, "new_block_ids": []int{0, 1, 2}, "computed_position": 0}},
		"num_scheduled": map[string]int{"r": 9}}, &br)
	var bind bindReply
	c.ok(map[string]any{"op": "bind", "iteration": br.Iteration}, &bind)
	if len(bind.Stores) != 1 || len(bind.Stores[0].Device) != 1 {
		t.Fatalf("bind: %+v, want one of two blocks staged", bind)
	}
	c.ok(map[string]any{"op": "saved", "iteration": br.Iteration}, nil)
	c.ok(map[string]any{"op": "get_finished"}, nil)
	var st statsReply
	c.ok(map[string]any{"op": "stats"}, &st)
	if st.StagingDropped != 1 || st.Stats.OffloadedHost != 1 {
		t.Fatalf("stats %+v, want one block stored and one dropped", st)
	}
	if len(s.free) != 1 {
		t.Fatalf("%d staging slots free after the step, want 1", len(s.free))
	}
}

// An arena left by a sidecar that died is removed by the next one of the
// same name; a live one's is kept.
func TestStaleArenaRemoved(t *testing.T) {
	dir := t.TempDir()
	dead := filepath.Join(dir, "test-2147483646.arena") // no such pid
	live := filepath.Join(dir, fmt.Sprintf("test-%d.arena", os.Getpid()))
	for _, p := range []string{dead, live} {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s, err := Listen(Config{Socket: filepath.Join(dir, "s.sock"), ShmDir: dir, Name: "test", HostBlocks: 1, StagingBlocks: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Fatalf("the dead sidecar's arena is still there: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Fatalf("a live sidecar's arena was removed: %v", err)
	}
}
