package events

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// An engine restarting on the same endpoint gets its subscriber back, even
// when a redial first reaches a listener that hangs up before the ZMQ
// handshake (the old process's listener closing, the port not yet the new
// publisher's): the subscription relies on zmq4's reconnect, which must
// not stop at a failed handshake.
func TestSubscriberRedialsAfterFailedHandshake(t *testing.T) {
	defer goleak.VerifyNone(t, leakOpts...)
	p := newTestPublisher(t, false)
	ep := p.Endpoint()
	_, c, stopSub := runSub(t, Config{Endpoint: ep, Instance: 1, BlockSize: 4})
	// The subscriber stops before the publisher closes: a redial accepted
	// while a zmq4 socket closes keeps a reader goroutine alive.
	var once sync.Once
	stop := func() { once.Do(stopSub) }
	defer stop()
	tickUntil(t, p, func() bool { _, d := c.snapshot(); return len(d) > 0 })
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	// The port answers, but not as a publisher: every connection is hung
	// up at once, until the subscriber has tried at least once.
	ln, err := net.Listen("tcp", strings.TrimPrefix(ep, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	tried := make(chan struct{})
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for n := 0; ; n++ {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conn.Close()
			if n == 0 {
				close(tried)
			}
		}
	}()
	select {
	case <-tried:
	case <-time.After(10 * time.Second):
		t.Fatal("the subscriber never redialled")
	}
	ln.Close()
	<-accepted

	p2, err := NewPublisher(context.Background(), PublisherConfig{Endpoint: ep, BindMode: Bind, BlockSize: 4, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	_, before := c.snapshot()
	tickUntil(t, p2, func() bool { _, d := c.snapshot(); return len(d) > len(before) })
	stop()
}
