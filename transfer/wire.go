package transfer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/kvmesh/kvmesh/kv"
)

// Wire constants; doc.go describes the protocol.
const (
	magic0 = 'K'
	magic1 = 'T'

	// Version is the protocol version this package speaks.
	Version = 1

	headerLen    = 12
	blockMetaLen = 20 // index u32, hash u64, checksum u64
	fetchFixed   = 14 // timeout_ms u32, flags u32, digest_len u16, count u32

	// MaxHashes bounds the blocks of one fetch request: a hint's limit.
	MaxHashes = kv.MaxHintBlocks
	// MaxDigestLen bounds the compatibility digest.
	MaxDigestLen = 255
	// maxMessage bounds the reason text of done/refuse frames.
	maxMessage = 1024
	// maxRequestFrame bounds a fetch frame's payload (hashes + digest).
	maxRequestFrame = fetchFixed + MaxDigestLen + 8*MaxHashes + 8
	// maxStatusFrame bounds a done/refuse frame's payload.
	maxStatusFrame = 8 + maxMessage
)

type frameType uint8

const (
	typeFetch  frameType = 1
	typeBlock  frameType = 2
	typeDone   frameType = 3
	typeRefuse frameType = 4
	// typeRelease (8) follows the auth frames (5-7, auth.go).
	typeRelease frameType = 8
)

// MaxHandoffIDLen bounds the handoff id of a release frame.
const MaxHandoffIDLen = 255

// maxReleaseFrame bounds a release frame's payload.
const maxReleaseFrame = 2 + MaxHandoffIDLen

func (t frameType) String() string {
	switch t {
	case typeFetch:
		return "fetch"
	case typeBlock:
		return "block"
	case typeDone:
		return "done"
	case typeRefuse:
		return "refuse"
	case typeHello:
		return "hello"
	case typeChallenge:
		return "challenge"
	case typeAuth:
		return "auth"
	case typeRelease:
		return "release"
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Code is the reason a source gives in done and refuse frames.
type Code uint8

const (
	CodeOK                 Code = 0
	CodeNotFound           Code = 1 // the source holds none of the requested blocks
	CodeDigestMismatch     Code = 2 // compatibility digests differ
	CodeBadRequest         Code = 3 // malformed or out-of-limit request
	CodeUnsupportedVersion Code = 4 // protocol version not spoken
	CodeBusy               Code = 5 // connection limit reached
	CodeTimeout            Code = 6 // the source's deadline passed mid-transfer
	CodeSourceError        Code = 7 // reading a pinned block failed
	CodeShutdown           Code = 8 // the source is shutting down
)

func (c Code) String() string {
	switch c {
	case CodeOK:
		return "ok"
	case CodeNotFound:
		return "not_found"
	case CodeDigestMismatch:
		return "digest_mismatch"
	case CodeBadRequest:
		return "bad_request"
	case CodeUnsupportedVersion:
		return "unsupported_version"
	case CodeBusy:
		return "busy"
	case CodeTimeout:
		return "timeout"
	case CodeSourceError:
		return "source_error"
	case CodeShutdown:
		return "shutdown"
	case CodeUnauthenticated:
		return "unauthenticated"
	}
	return fmt.Sprintf("code(%d)", uint8(c))
}

// header is the fixed 12-byte frame header.
type header struct {
	version uint8
	typ     frameType
	op      uint32
	length  uint32 // payload bytes after the header
}

func putHeader(b []byte, h header) {
	_ = b[headerLen-1]
	b[0], b[1], b[2], b[3] = magic0, magic1, h.version, uint8(h.typ)
	binary.LittleEndian.PutUint32(b[4:], h.op)
	binary.LittleEndian.PutUint32(b[8:], h.length)
}

// errBadMagic marks a peer that does not speak this protocol at all.
var errBadMagic = errors.New("bad frame magic (peer does not speak the kvmesh transfer protocol)")

func parseHeader(b []byte) (header, error) {
	if b[0] != magic0 || b[1] != magic1 {
		return header{}, errBadMagic
	}
	return header{
		version: b[2],
		typ:     frameType(b[3]),
		op:      binary.LittleEndian.Uint32(b[4:]),
		length:  binary.LittleEndian.Uint32(b[8:]),
	}, nil
}

func readHeader(r io.Reader, b *[headerLen]byte) (header, error) {
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return header{}, err
	}
	return parseHeader(b[:])
}

// flagDomain marks a fetch that names its salt domain: a u64 after the
// hashes. Without it the domain is kv.BaseSeed (no LoRA, no salt).
const flagDomain uint32 = 1

// fetchReq is the decoded payload of a fetch frame.
type fetchReq struct {
	timeoutMs uint32
	flags     uint32
	digest    string
	hashes    []uint64
	domain    uint64 // the salt domain (kv.Seed), kv.BaseSeed when flags lacks flagDomain
}

func appendFetch(dst []byte, op uint32, r fetchReq) []byte {
	if r.domain != 0 && r.domain != kv.BaseSeed { // 0: unset, the base domain
		r.flags |= flagDomain
	}
	n := fetchFixed + len(r.digest) + 8*len(r.hashes)
	if r.flags&flagDomain != 0 {
		n += 8
	}
	start := len(dst)
	dst = append(dst, make([]byte, headerLen+n)...)
	b := dst[start:]
	putHeader(b, header{version: Version, typ: typeFetch, op: op, length: uint32(n)})
	p := b[headerLen:]
	binary.LittleEndian.PutUint32(p[0:], r.timeoutMs)
	binary.LittleEndian.PutUint32(p[4:], r.flags)
	binary.LittleEndian.PutUint16(p[8:], uint16(len(r.digest)))
	copy(p[10:], r.digest)
	q := p[10+len(r.digest):]
	binary.LittleEndian.PutUint32(q, uint32(len(r.hashes)))
	q = q[4:]
	for i, h := range r.hashes {
		binary.LittleEndian.PutUint64(q[8*i:], h)
	}
	if r.flags&flagDomain != 0 {
		binary.LittleEndian.PutUint64(q[8*len(r.hashes):], r.domain)
	}
	return dst
}

// decodeFetch parses a fetch payload. Every length is checked against the
// frame before use, so a hostile frame can neither over-read nor make the
// decoder allocate more than the (already bounded) frame it came in.
func decodeFetch(p []byte) (fetchReq, error) {
	if len(p) < fetchFixed {
		return fetchReq{}, fmt.Errorf("fetch frame of %d bytes is shorter than its %d fixed bytes", len(p), fetchFixed)
	}
	var r fetchReq
	r.timeoutMs = binary.LittleEndian.Uint32(p[0:])
	r.flags = binary.LittleEndian.Uint32(p[4:])
	dl := int(binary.LittleEndian.Uint16(p[8:]))
	if dl > MaxDigestLen {
		return fetchReq{}, fmt.Errorf("digest length %d exceeds %d", dl, MaxDigestLen)
	}
	if len(p) < fetchFixed+dl {
		return fetchReq{}, fmt.Errorf("digest length %d overruns the %d-byte frame", dl, len(p))
	}
	r.digest = string(p[10 : 10+dl])
	q := p[10+dl:]
	count := binary.LittleEndian.Uint32(q)
	q = q[4:]
	if count == 0 {
		return fetchReq{}, errors.New("fetch asks for no blocks")
	}
	if count > MaxHashes {
		return fetchReq{}, fmt.Errorf("fetch asks for %d blocks, limit %d", count, MaxHashes)
	}
	if r.flags&^flagDomain != 0 {
		return fetchReq{}, fmt.Errorf("fetch flags %#x unknown in version %d", r.flags, Version)
	}
	r.domain = kv.BaseSeed
	if r.flags&flagDomain != 0 {
		if len(q) < 8 {
			return fetchReq{}, errors.New("fetch flags a salt domain but carries none")
		}
		r.domain = binary.LittleEndian.Uint64(q[len(q)-8:])
		q = q[:len(q)-8]
	}
	if uint64(len(q)) != 8*uint64(count) {
		return fetchReq{}, fmt.Errorf("fetch declares %d hashes but carries %d bytes of them", count, len(q))
	}
	if r.timeoutMs == 0 {
		return fetchReq{}, errors.New("fetch timeout is zero")
	}
	r.hashes = make([]uint64, count)
	for i := range r.hashes {
		r.hashes[i] = binary.LittleEndian.Uint64(q[8*i:])
	}
	return r, nil
}

// status is the payload of done and refuse frames.
type status struct {
	completed uint32
	success   bool
	code      Code
	msg       string
}

func appendStatus(dst []byte, typ frameType, op uint32, s status) []byte {
	msg := s.msg
	if len(msg) > maxMessage {
		msg = msg[:maxMessage]
	}
	n := 8 + len(msg)
	start := len(dst)
	dst = append(dst, make([]byte, headerLen+n)...)
	b := dst[start:]
	putHeader(b, header{version: Version, typ: typ, op: op, length: uint32(n)})
	p := b[headerLen:]
	binary.LittleEndian.PutUint32(p[0:], s.completed)
	if s.success {
		p[4] = 1
	}
	p[5] = uint8(s.code)
	binary.LittleEndian.PutUint16(p[6:], uint16(len(msg)))
	copy(p[8:], msg)
	return dst
}

func decodeStatus(p []byte) (status, error) {
	if len(p) < 8 {
		return status{}, fmt.Errorf("status frame of %d bytes is shorter than 8", len(p))
	}
	ml := int(binary.LittleEndian.Uint16(p[6:]))
	if 8+ml != len(p) {
		return status{}, fmt.Errorf("status message length %d does not fit the %d-byte frame", ml, len(p))
	}
	if p[4] > 1 {
		return status{}, fmt.Errorf("status success byte %d is not 0 or 1", p[4])
	}
	return status{
		completed: binary.LittleEndian.Uint32(p[0:]),
		success:   p[4] == 1,
		code:      Code(p[5]),
		msg:       string(p[8:]),
	}, nil
}

// putBlockMeta writes a block frame's header and metadata in front of its
// payload (b must have headerLen+blockMetaLen bytes).
func putBlockMeta(b []byte, op uint32, index uint32, hash, sum uint64, payloadLen int) {
	putHeader(b, header{version: Version, typ: typeBlock, op: op, length: uint32(blockMetaLen + payloadLen)})
	binary.LittleEndian.PutUint32(b[headerLen:], index)
	binary.LittleEndian.PutUint64(b[headerLen+4:], hash)
	binary.LittleEndian.PutUint64(b[headerLen+12:], sum)
}

// appendRelease encodes a release frame: u16 id_len, then the id.
func appendRelease(dst []byte, op uint32, id string) []byte {
	n := 2 + len(id)
	start := len(dst)
	dst = append(dst, make([]byte, headerLen+n)...)
	b := dst[start:]
	putHeader(b, header{version: Version, typ: typeRelease, op: op, length: uint32(n)})
	binary.LittleEndian.PutUint16(b[headerLen:], uint16(len(id)))
	copy(b[headerLen+2:], id)
	return dst
}

// decodeRelease parses a release payload: a non-empty id of at most
// MaxHandoffIDLen bytes that fills the frame exactly.
func decodeRelease(p []byte) (string, error) {
	if len(p) < 2 {
		return "", fmt.Errorf("release frame of %d bytes is shorter than 2", len(p))
	}
	n := int(binary.LittleEndian.Uint16(p))
	switch {
	case n == 0:
		return "", errors.New("release names no handoff")
	case n > MaxHandoffIDLen:
		return "", fmt.Errorf("release handoff id of %d bytes exceeds %d", n, MaxHandoffIDLen)
	case 2+n != len(p):
		return "", fmt.Errorf("release handoff id length %d does not fit the %d-byte frame", n, len(p))
	}
	return string(p[2:]), nil
}
