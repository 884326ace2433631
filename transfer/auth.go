package transfer

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// The fleet-token handshake (doc.go, "Authentication"): the client opens a
// connection with hello{client nonce}; the source answers challenge{source
// nonce, source proof}; the client checks the proof and sends auth{client
// proof}. Each proof is HMAC-SHA256 keyed by the fleet token over a label
// and both nonces, so neither side learns the token, both prove they hold
// it, and a recorded handshake cannot be replayed on a new connection.
const (
	typeHello     frameType = 5
	typeChallenge frameType = 6
	typeAuth      frameType = 7

	nonceLen     = 16
	proofLen     = sha256.Size
	challengeLen = nonceLen + proofLen

	// CodeUnauthenticated: the peer did not prove it holds the fleet token.
	CodeUnauthenticated Code = 9

	// handshakeTimeout bounds a handshake on either side.
	handshakeTimeout = 5 * time.Second

	refusedUnauthenticated = "unauthenticated"
)

// ErrUnauthenticated is a handshake that failed: the source refused this
// client's token or proved no token of its own.
var ErrUnauthenticated = errors.New("transfer: fleet authentication failed")

func proof(token []byte, label string, cn, sn []byte) []byte {
	m := hmac.New(sha256.New, token)
	m.Write([]byte("kvmesh transfer v1 " + label))
	m.Write(cn)
	m.Write(sn)
	return m.Sum(nil)
}

func appendFrame(dst []byte, typ frameType, payload []byte) []byte {
	var h [headerLen]byte
	putHeader(h[:], header{version: Version, typ: typ, length: uint32(len(payload))})
	return append(append(dst, h[:]...), payload...)
}

// readFrame reads one frame of type want and exactly n payload bytes. A
// refuse frame becomes an error carrying the source's reason.
func readFrame(r io.Reader, want frameType, n int) ([]byte, error) {
	var hb [headerLen]byte
	h, err := readHeader(r, &hb)
	if err != nil {
		return nil, err
	}
	if h.typ == typeRefuse && h.length <= maxStatusFrame {
		p := make([]byte, h.length)
		if _, err := io.ReadFull(r, p); err != nil {
			return nil, err
		}
		st, err := decodeStatus(p)
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("refused (%v): %s", st.code, st.msg)
	}
	if h.version != Version || h.typ != want || int(h.length) != n {
		return nil, fmt.Errorf("got a %d-byte %s frame (version %d), want a %d-byte %s frame", h.length, h.typ, h.version, n, want)
	}
	p := make([]byte, n)
	_, err = io.ReadFull(r, p)
	return p, err
}

// clientHandshake proves the client's token on a fresh connection.
func clientHandshake(c net.Conn, token []byte, deadline time.Time) error {
	c.SetDeadline(deadline)
	defer c.SetDeadline(time.Time{})
	cn := make([]byte, nonceLen)
	_, _ = rand.Read(cn)
	if _, err := c.Write(appendFrame(nil, typeHello, cn)); err != nil {
		return err
	}
	ch, err := readFrame(c, typeChallenge, challengeLen)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnauthenticated, err)
	}
	sn := ch[:nonceLen]
	if !hmac.Equal(ch[nonceLen:], proof(token, "source", cn, sn)) {
		return fmt.Errorf("%w: the source proved a different fleet token", ErrUnauthenticated)
	}
	_, err = c.Write(appendFrame(nil, typeAuth, proof(token, "target", cn, sn)))
	return err
}

// authenticate runs the source's side of the handshake before any fetch
// is read; a peer that fails it is refused (and counted, and logged once
// per host) before it can name a block.
func (s *Server) authenticate(br *bufio.Reader, c net.Conn) bool {
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	defer c.SetDeadline(time.Time{})
	cn, err := readFrame(br, typeHello, nonceLen)
	if err != nil {
		s.unauthenticated(c, err)
		return false
	}
	sn := make([]byte, nonceLen)
	_, _ = rand.Read(sn)
	if _, err := c.Write(appendFrame(nil, typeChallenge, append(sn, proof(s.Token, "source", cn, sn)...))); err != nil {
		return false
	}
	p, err := readFrame(br, typeAuth, proofLen)
	if err == nil && !hmac.Equal(p, proof(s.Token, "target", cn, sn)) {
		err = errors.New("wrong fleet token")
	}
	if err != nil {
		s.unauthenticated(c, err)
		return false
	}
	return true
}

// serverTLS runs the TLS handshake (mutual, when the config requires client
// certificates) before anything is read; nil when the peer failed it.
func (s *Server) serverTLS(ctx context.Context, c net.Conn) net.Conn {
	tc := tls.Server(c, s.TLS)
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		s.refusedPeer(c, "that failed the TLS handshake", err)
		return nil
	}
	return tc
}

// clientTLS wraps a fresh connection to host in TLS.
func clientTLS(ctx context.Context, nc net.Conn, cfg *tls.Config, host string) (net.Conn, error) {
	cfg = cfg.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName = host
	}
	tc := tls.Client(nc, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, fmt.Errorf("%w: TLS: %v", ErrUnauthenticated, err)
	}
	return tc, nil
}

// maxWarnedPeers bounds the hosts remembered for logging once.
const maxWarnedPeers = 1024

func (s *Server) unauthenticated(c net.Conn, err error) {
	s.refuse(c, 0, CodeUnauthenticated, "this source requires the fleet token")
	s.refusedPeer(c, "without the fleet token", err)
}

// refusedPeer counts a peer refused for want of credentials and logs it
// once per host.
func (s *Server) refusedPeer(c net.Conn, what string, err error) {
	s.Metrics.refuse(refusedUnauthenticated)
	host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
	s.warnMu.Lock()
	if s.warned == nil {
		s.warned = map[string]bool{}
	}
	first := !s.warned[host] && len(s.warned) < maxWarnedPeers
	if first {
		s.warned[host] = true
	}
	s.warnMu.Unlock()
	if first && s.Logger != nil {
		s.Logger.Warn("transfer: refused a peer "+what+" (logged once per host)", "peer", host, "err", err)
	}
}

// warnedPeers is embedded in Server.
type warnedPeers struct {
	warnMu sync.Mutex
	warned map[string]bool
}
