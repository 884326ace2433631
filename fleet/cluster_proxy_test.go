package fleet

import (
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvmesh/kvmesh/discovery"
)

const syscallSIGSTOP = syscall.SIGSTOP

// rawBucket is the discovery bucket itself, for writing records no worker
// would write.
func (e *e2e) rawBucket() jetstream.KeyValue {
	e.t.Helper()
	js, err := jetstream.New(e.nc)
	if err != nil {
		e.t.Fatal(err)
	}
	kvb, err := js.KeyValue(e.ctx, discovery.DefaultBucket)
	if err != nil {
		e.t.Fatal(err)
	}
	return kvb
}

// tcpProxy forwards loopback TCP connections to a target and can cut them:
// a network partition between one client and the NATS server.
type tcpProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// newTCPProxy proxies to the host:port of a nats:// URL until cleanup.
func newTCPProxy(t *testing.T, natsURL string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: strings.TrimPrefix(natsURL, "nats://"), conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *tcpProxy) url() string { return "nats://" + p.ln.Addr().String() }

func (p *tcpProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.down {
			p.mu.Unlock()
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c], p.conns[up] = true, true
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

// pipe copies until either side fails, then closes both.
func (p *tcpProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
	dst.Close()
	src.Close()
}

// cut drops every connection and refuses new ones until heal.
func (p *tcpProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
}

func (p *tcpProxy) heal() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

func (p *tcpProxy) close() {
	_ = p.ln.Close()
	p.cut()
	p.wg.Wait()
}
