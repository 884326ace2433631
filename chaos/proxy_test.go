package chaos

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// listener accepts connections and hands each to handle until closed;
// closing it also closes every connection it accepted (and their upstreams,
// which handle registers with track).
type listener struct {
	ln    net.Listener
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func listen(t *testing.T, handle func(l *listener, c net.Conn)) *listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &listener{ln: ln, conns: map[net.Conn]struct{}{}}
	l.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !l.track(c) {
				return
			}
			l.wg.Go(func() { handle(l, c) })
		}
	})
	t.Cleanup(l.close)
	return l
}

func (l *listener) addr() string { return l.ln.Addr().String() }

// track registers c so close closes it; false once closed (c is closed).
func (l *listener) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conns == nil {
		c.Close()
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *listener) untrack(cs ...net.Conn) {
	l.mu.Lock()
	for _, c := range cs {
		c.Close()
		delete(l.conns, c)
	}
	l.mu.Unlock()
}

func (l *listener) close() {
	l.ln.Close()
	l.mu.Lock()
	for c := range l.conns {
		c.Close()
	}
	l.conns = nil
	l.mu.Unlock()
	l.wg.Wait()
}

// natsProxy sits between workers and the NATS server and speaks enough of
// the client protocol to drop whole event batches: while drop > 0, each PUB
// or HPUB on a kvmesh.events.* subject is swallowed (and counted) instead of
// forwarded, so the event plane sees a real gap. Everything else passes
// byte for byte; a dead upstream (NATS restarting) closes the client side,
// and the client reconnects through the proxy.
type natsProxy struct {
	*listener
	upstream atomic.Pointer[string]
	drop     atomic.Int64 // event batches still to drop
	dropped  atomic.Int64
}

func startNATSProxy(t *testing.T, upstream string) *natsProxy {
	p := &natsProxy{}
	p.upstream.Store(&upstream)
	p.listener = listen(t, p.handle)
	return p
}

func (p *natsProxy) url() string { return "nats://" + p.addr() }

func (p *natsProxy) handle(l *listener, c net.Conn) {
	u, err := net.Dial("tcp", *p.upstream.Load())
	if err != nil || !l.track(u) {
		l.untrack(c)
		return
	}
	defer l.untrack(c, u)
	go func() {
		io.Copy(c, u)
		l.untrack(c, u)
	}()
	br := bufio.NewReaderSize(c, 64<<10)
	bw := bufio.NewWriterSize(u, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			return
		}
		var payload []byte
		op, rest, _ := bytes.Cut(bytes.TrimRight(line, "\r\n"), []byte(" "))
		if isOp(op, "PUB") || isOp(op, "HPUB") {
			f := bytes.Fields(rest)
			if len(f) < 2 {
				return
			}
			n, err := strconv.Atoi(string(f[len(f)-1]))
			if err != nil || n < 0 {
				return
			}
			payload = make([]byte, n+2) // payload and its CRLF
			if _, err := io.ReadFull(br, payload); err != nil {
				return
			}
			if bytes.HasPrefix(f[0], []byte("kvmesh.events.")) && p.drop.Load() > 0 && p.drop.Add(-1) >= 0 {
				p.dropped.Add(1)
				continue
			}
		}
		bw.Write(line)
		bw.Write(payload)
		if br.Buffered() == 0 {
			if bw.Flush() != nil {
				return
			}
		}
	}
}

func isOp(op []byte, name string) bool { return bytes.EqualFold(op, []byte(name)) }

// Modes of a peerProxy.
const (
	peerPass    int32 = iota
	peerCorrupt       // flip one byte in every chunk the source sends
	peerStall         // forward half a chunk, then nothing: a source that hangs mid-transfer
)

// peerProxy sits in front of one worker's control endpoint (the worker
// advertises it through KVMESH_FAULT_CONTROL_ADVERTISE) and passes,
// corrupts or stalls what the source sends back; it applies to pooled
// connections too, since it decides per chunk.
type peerProxy struct {
	*listener
	target    string
	mode      atomic.Int32
	corrupted atomic.Int64
	stalled   atomic.Int64
}

func startPeerProxy(t *testing.T, target string) *peerProxy {
	p := &peerProxy{target: target}
	p.listener = listen(t, p.handle)
	return p
}

func (p *peerProxy) handle(l *listener, c net.Conn) {
	u, err := net.Dial("tcp", p.target)
	if err != nil || !l.track(u) {
		l.untrack(c)
		return
	}
	defer l.untrack(c, u)
	go func() {
		io.Copy(u, c)
		l.untrack(c, u)
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := u.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			switch p.mode.Load() {
			case peerCorrupt:
				chunk[n/2] ^= 0x5a
				p.corrupted.Add(1)
			case peerStall:
				c.Write(chunk[:n/2])
				p.stalled.Add(1)
				// Hold the connection open, sending nothing, until the
				// fetching side gives up and closes it.
				io.Copy(io.Discard, u)
				return
			}
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
