package events

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/go-zeromq/zmq4"
)

// BindMode says whether a socket binds or connects its endpoint.
type BindMode uint8

const (
	// BindAuto follows vLLM: bind when the endpoint contains "*" or "::" or
	// is ipc:// or inproc://, else connect. Port 0 also binds (connecting to
	// it is meaningless), so tests can ask for a free port.
	BindAuto BindMode = iota
	Bind
	Connect
)

// ShouldBind applies vLLM's rule (plus port 0) to an endpoint.
func ShouldBind(endpoint string) bool {
	if strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://") {
		return true
	}
	if hostport, ok := strings.CutPrefix(endpoint, "tcp://"); ok {
		if _, port, err := net.SplitHostPort(hostport); err == nil && port == "0" {
			return true
		}
	}
	return false
}

// RankEndpoint is the endpoint DP rank r uses, as vLLM derives it: a TCP
// port offset by r, an inproc name suffixed with _dp<r>, others unchanged.
func RankEndpoint(endpoint string, rank int) (string, error) {
	if rank == 0 {
		return endpoint, nil
	}
	if name, ok := strings.CutPrefix(endpoint, "inproc://"); ok {
		return fmt.Sprintf("inproc://%s_dp%d", name, rank), nil
	}
	hostport, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return endpoint, nil
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", fmt.Errorf("endpoint %q: %w", endpoint, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p <= 0 || p+rank > 65535 {
		return "", fmt.Errorf("endpoint %q: cannot offset port %q by rank %d", endpoint, port, rank)
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(p+rank)), nil
}

// attach binds or connects sock. It returns the endpoint actually bound
// (port 0 resolved) or endpoint itself when connecting.
func attach(sock zmq4.Socket, endpoint string, mode BindMode) (string, error) {
	bind := mode == Bind || (mode == BindAuto && ShouldBind(endpoint))
	if !bind {
		if err := sock.Dial(endpoint); err != nil {
			return "", fmt.Errorf("connect %s: %w", endpoint, err)
		}
		return endpoint, nil
	}
	if err := sock.Listen(endpoint); err != nil {
		return "", fmt.Errorf("bind %s: %w", endpoint, err)
	}
	if a, ok := sock.Addr().(*net.TCPAddr); ok && strings.HasPrefix(endpoint, "tcp://") {
		return "tcp://" + a.String(), nil
	}
	return endpoint, nil
}

// seqBytes is the 8-byte big-endian sequence frame.
func seqBytes(seq uint64) []byte {
	var b [8]byte
	for i := 7; i >= 0; i-- {
		b[i] = byte(seq)
		seq >>= 8
	}
	return b[:]
}

func seqOf(b []byte) (uint64, bool) {
	if len(b) != 8 {
		return 0, false
	}
	var v uint64
	for _, x := range b {
		v = v<<8 | uint64(x)
	}
	return v, true
}

// endMarker is seq -1 as signed 8 bytes: the end of a replay.
var endMarker = seqBytes(^uint64(0))
