package sidecar

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Version is the wire version this server speaks; a frame of another
// version is answered with an error frame and the connection closed.
const Version = 1

// Frame kinds.
const (
	KindRequest byte = 1
	KindReply   byte = 2
	KindError   byte = 3
)

// HeaderSize is the fixed frame header: "KB", version, kind, payload length.
const HeaderSize = 8

// MaxPayload bounds one frame's JSON: a prompt of a million tokens as
// decimal JSON fits, a corrupt length does not make the server allocate.
const MaxPayload = 16 << 20

// frameError is a framing fault: the stream can no longer be trusted, so
// the server answers it and closes the connection.
type frameError struct{ msg string }

func (e *frameError) Error() string { return e.msg }

// readFrame reads one frame; a frameError means the stream is out of step.
func readFrame(r io.Reader, hdr *[HeaderSize]byte) (kind byte, payload []byte, err error) {
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	if hdr[0] != 'K' || hdr[1] != 'B' {
		return 0, nil, &frameError{fmt.Sprintf("bad magic %q, want \"KB\"", hdr[:2])}
	}
	if hdr[2] != Version {
		return 0, nil, &frameError{fmt.Sprintf("wire version %d, this sidecar speaks %d", hdr[2], Version)}
	}
	n := binary.BigEndian.Uint32(hdr[4:])
	if n > MaxPayload {
		return 0, nil, &frameError{fmt.Sprintf("payload of %d bytes, at most %d", n, MaxPayload)}
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return hdr[3], payload, nil
}

// appendFrame appends one frame of kind carrying v as JSON.
func appendFrame(dst []byte, kind byte, v any) ([]byte, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return dst, err
	}
	if len(body) > MaxPayload {
		return dst, fmt.Errorf("reply of %d bytes, at most %d", len(body), MaxPayload)
	}
	dst = append(dst, 'K', 'B', Version, kind, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(dst[len(dst)-4:], uint32(len(body)))
	return append(dst, body...), nil
}

// errorReply is an error frame's payload. Code is a short machine word
// (bad_frame, bad_request, not_registered, failed), Error the message.
type errorReply struct {
	Code  string `json:"code"`
	Error string `json:"error"`
}
