package chaos

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvmesh/kvmesh/natsbus"
)

// The NATS proxy passes the client protocol through byte for byte and, when
// told, swallows exactly one event batch (PUB or HPUB on kvmesh.events.*),
// never other subjects.
func TestNATSProxyDropsOneEventBatch(t *testing.T) {
	ns, err := natsbus.StartEmbedded(natsbus.EmbeddedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	p := startNATSProxy(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(ns.Port())))
	direct, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	got := make(chan string, 16)
	if _, err := direct.Subscribe(">", func(m *nats.Msg) { got <- m.Subject + " " + string(m.Data) + " " + m.Header.Get("h") }); err != nil {
		t.Fatal(err)
	}
	direct.Flush()
	via, err := nats.Connect(p.url())
	if err != nil {
		t.Fatal(err)
	}
	defer via.Close()
	p.drop.Store(1)
	via.Publish("other.subject", []byte("a"))
	via.PublishMsg(&nats.Msg{Subject: "kvmesh.events.m.1", Data: []byte("dropped"), Header: nats.Header{"h": {"x"}}})
	via.Publish("kvmesh.events.m.1", []byte("b"))
	via.PublishMsg(&nats.Msg{Subject: "kvmesh.events.m.2", Data: []byte("c"), Header: nats.Header{"h": {"y"}}})
	via.Flush()
	want := []string{"other.subject a ", "kvmesh.events.m.1 b ", "kvmesh.events.m.2 c y"}
	for _, w := range want {
		select {
		case g := <-got:
			if g != w {
				t.Fatalf("received %q, want %q", g, w)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%q never arrived", w)
		}
	}
	if n := p.dropped.Load(); n != 1 {
		t.Errorf("dropped %d batches, want 1", n)
	}
}

// The peer proxy passes a source's bytes, flips one byte per chunk when
// corrupting, and forwards half a chunk then holds the connection silent
// when stalling.
func TestPeerProxyModes(t *testing.T) {
	payload := make([]byte, 1000)
	for i := range payload {
		payload[i] = byte(i)
	}
	src, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	go func() {
		for {
			c, err := src.Accept()
			if err != nil {
				return
			}
			go func() {
				var b [1]byte
				c.Read(b[:]) // a request, then the answer in one write
				c.Write(payload)
				c.Read(b[:]) // until the client closes
				c.Close()
			}()
		}
	}()
	p := startPeerProxy(t, src.Addr().String())
	fetch := func() ([]byte, error) {
		c, err := net.Dial("tcp", p.addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte{1})
		c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		out := make([]byte, 0, len(payload))
		buf := make([]byte, 4096)
		for len(out) < len(payload) {
			n, err := c.Read(buf)
			out = append(out, buf[:n]...)
			if err != nil {
				return out, err
			}
		}
		return out, nil
	}
	if got, err := fetch(); err != nil || string(got) != string(payload) {
		t.Fatalf("pass: %d bytes, %v", len(got), err)
	}
	p.mode.Store(peerCorrupt)
	got, err := fetch()
	diff := 0
	for i := range got {
		if got[i] != payload[i] {
			diff++
		}
	}
	if err != nil || len(got) != len(payload) || diff == 0 || int64(diff) != p.corrupted.Load() {
		t.Fatalf("corrupt: %d bytes, %d differ, %d chunks corrupted, %v", len(got), diff, p.corrupted.Load(), err)
	}
	p.mode.Store(peerStall)
	got, err = fetch()
	if err == nil || len(got) >= len(payload) || p.stalled.Load() != 1 {
		t.Fatalf("stall: %d bytes, %v, stalled %d; want a partial answer and a timeout", len(got), err, p.stalled.Load())
	}
}
