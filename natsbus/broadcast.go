package natsbus

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
)

const senderHeader = "Kvmesh-Sender"

// Broadcast is best-effort fan-out of opaque messages among peers (router
// replicas) on one subject; a peer never receives its own messages.
type Broadcast struct {
	nc      *nats.Conn
	subject string
	self    string
	sub     *nats.Subscription
}

// NewBroadcast joins subject as self and calls fn(from, data) serially for
// each message another peer publishes. The data slice is owned by fn.
func NewBroadcast(nc *nats.Conn, subject, self string, fn func(from string, data []byte)) (*Broadcast, error) {
	if subject == "" || self == "" {
		return nil, errors.New("broadcast: subject and self id are required")
	}
	b := &Broadcast{nc: nc, subject: subject, self: self}
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		from := m.Header.Get(senderHeader)
		if from == self || from == "" {
			return
		}
		fn(from, m.Data)
	})
	if err != nil {
		return nil, fmt.Errorf("broadcast: subscribe %s: %w", subject, err)
	}
	b.sub = sub
	return b, nil
}

// Publish sends data to every other peer.
func (b *Broadcast) Publish(data []byte) error {
	m := nats.NewMsg(b.subject)
	m.Header.Set(senderHeader, b.self)
	m.Data = data
	if err := b.nc.PublishMsg(m); err != nil {
		return fmt.Errorf("broadcast: publish %s: %w", b.subject, err)
	}
	return nil
}

// Close leaves the subject.
func (b *Broadcast) Close() error { return b.sub.Unsubscribe() }
