package events

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"

	"github.com/kvmesh/kvmesh/kv"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// ErrMalformed wraps every decode failure, so callers can count them.
var ErrMalformed = errors.New("malformed event batch")

// DecodeStats counts what the decoder tolerated in one batch.
type DecodeStats struct {
	UnknownEvents int // events with a tag we do not know; skipped
}

// maxSkipDepth bounds nesting in ignored fields: deeper input is hostile.
const maxSkipDepth = 64

type decoder struct {
	r     bytes.Reader
	buf   []byte // what r reads, for tokens' fast path
	d     *msgpack.Decoder
	stats DecodeStats
}

var decoderPool = sync.Pool{New: func() any {
	dec := &decoder{}
	dec.d = msgpack.NewDecoder(&dec.r)
	return dec
}}

// DecodeBatch decodes one EventBatch payload. It accepts the batch and each
// event as an array or a map, hashes as u64, i64 (bit-cast) or bytes (last 8
// bytes, big-endian), ignores unknown fields and tolerates missing trailing
// ones. Events with unknown tags are skipped and counted in stats. Every
// error wraps ErrMalformed; no declared length is trusted beyond the bytes
// that are actually there.
func DecodeBatch(payload []byte) (*Batch, DecodeStats, error) {
	dec := decoderPool.Get().(*decoder)
	defer decoderPool.Put(dec)
	dec.r.Reset(payload)
	dec.buf = payload
	defer func() { dec.buf = nil }() // the pool keeps no payload
	dec.d.Reset(&dec.r)
	dec.stats = DecodeStats{}
	b, err := dec.batch()
	if err == nil && dec.r.Len() != 0 {
		err = fmt.Errorf("%d trailing bytes after the batch", dec.r.Len())
	}
	if err != nil {
		return nil, dec.stats, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return b, dec.stats, nil
}

func (dec *decoder) peek() (byte, error) {
	c, err := dec.d.PeekCode()
	if err != nil {
		return 0, fmt.Errorf("truncated: %w", err)
	}
	return c, nil
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Int64)
}

func isStr(c byte) bool { return msgpcode.IsString(c) }

func isBin(c byte) bool { return msgpcode.IsBin(c) }

// arrayLen reads an array header and checks the length against the bytes
// left: every element takes at least one byte.
func (dec *decoder) arrayLen(what string) (int, error) {
	c, err := dec.peek()
	if err != nil {
		return 0, err
	}
	if !isArray(c) {
		return 0, fmt.Errorf("%s: want array, got msgpack code 0x%02x", what, c)
	}
	n, err := dec.d.DecodeArrayLen()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	if n > dec.r.Len() {
		return 0, fmt.Errorf("%s: array of %d elements but only %d bytes left", what, n, dec.r.Len())
	}
	return n, nil
}

func (dec *decoder) mapLen(what string) (int, error) {
	c, err := dec.peek()
	if err != nil {
		return 0, err
	}
	if !isMap(c) {
		return 0, fmt.Errorf("%s: want map, got msgpack code 0x%02x", what, c)
	}
	n, err := dec.d.DecodeMapLen()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	if n > dec.r.Len()/2 {
		return 0, fmt.Errorf("%s: map of %d entries but only %d bytes left", what, n, dec.r.Len())
	}
	return n, nil
}

// nextIsNil consumes a nil and reports true, or leaves a non-nil in place.
func (dec *decoder) nextIsNil() (bool, error) {
	c, err := dec.peek()
	if err != nil {
		return false, err
	}
	if c == msgpcode.Nil {
		return true, dec.d.DecodeNil()
	}
	return false, nil
}

func (dec *decoder) str(what string) (string, error) {
	c, err := dec.peek()
	if err != nil {
		return "", err
	}
	if !isStr(c) && !isBin(c) {
		return "", fmt.Errorf("%s: want string, got msgpack code 0x%02x", what, c)
	}
	if err := dec.checkBytesLen(c, what); err != nil {
		return "", err
	}
	if isBin(c) {
		b, err := dec.d.DecodeBytes()
		return string(b), err
	}
	s, err := dec.d.DecodeString()
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	return s, nil
}

// checkBytesLen refuses a str/bin header that declares more bytes than are
// left, before the library tries to read them.
func (dec *decoder) checkBytesLen(c byte, what string) error {
	var n int
	switch {
	case msgpcode.IsFixedString(c):
		return nil
	case c == msgpcode.Str8 || c == msgpcode.Bin8:
		n = 1
	case c == msgpcode.Str16 || c == msgpcode.Bin16:
		n = 2
	case c == msgpcode.Str32 || c == msgpcode.Bin32:
		n = 4
	default:
		return nil
	}
	left := dec.r.Len()
	if left < 1+n {
		return fmt.Errorf("%s: truncated length", what)
	}
	// Peek at the header without consuming: bytes.Reader.ReadAt is stateless.
	var hdr [5]byte
	off := int64(dec.r.Size()) - int64(left)
	if _, err := dec.r.ReadAt(hdr[:1+n], off); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	var size int
	switch n {
	case 1:
		size = int(hdr[1])
	case 2:
		size = int(binary.BigEndian.Uint16(hdr[1:]))
	case 4:
		size = int(binary.BigEndian.Uint32(hdr[1:]))
	}
	if size > left-1-n {
		return fmt.Errorf("%s: %d bytes declared but only %d left", what, size, left-1-n)
	}
	return nil
}

func (dec *decoder) optStr(what string) (string, bool, error) {
	if isNil, err := dec.nextIsNil(); err != nil || isNil {
		return "", false, err
	}
	s, err := dec.str(what)
	return s, err == nil, err
}

func (dec *decoder) int64(what string) (int64, error) {
	c, err := dec.peek()
	if err != nil {
		return 0, err
	}
	if !isInt(c) {
		return 0, fmt.Errorf("%s: want integer, got msgpack code 0x%02x", what, c)
	}
	if c == msgpcode.Uint64 {
		v, err := dec.d.DecodeUint64()
		if err != nil {
			return 0, fmt.Errorf("%s: %w", what, err)
		}
		if v > math.MaxInt64 {
			return 0, fmt.Errorf("%s: %d out of range", what, v)
		}
		return int64(v), nil
	}
	v, err := dec.d.DecodeInt64()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	return v, nil
}

func (dec *decoder) optInt64(what string) (int64, bool, error) {
	if isNil, err := dec.nextIsNil(); err != nil || isNil {
		return 0, false, err
	}
	v, err := dec.int64(what)
	return v, err == nil, err
}

// hash reads an engine block hash: an unsigned or signed integer (negative
// values are bit-cast) or a byte string whose last 8 bytes, big-endian, are
// the low 64 bits vLLM publishes as ints.
func (dec *decoder) hash(what string) (kv.EngineHash, error) {
	c, err := dec.peek()
	if err != nil {
		return 0, err
	}
	switch {
	case isInt(c):
		v, err := dec.d.DecodeUint64() // the library bit-casts signed codes
		if err != nil {
			return 0, fmt.Errorf("%s: %w", what, err)
		}
		return kv.EngineHash(v), nil
	case isBin(c) || isStr(c):
		if err := dec.checkBytesLen(c, what); err != nil {
			return 0, err
		}
		var b []byte
		if isBin(c) {
			b, err = dec.d.DecodeBytes()
		} else {
			var s string
			s, err = dec.d.DecodeString()
			b = []byte(s)
		}
		if err != nil {
			return 0, fmt.Errorf("%s: %w", what, err)
		}
		if len(b) == 0 {
			return 0, fmt.Errorf("%s: empty byte hash", what)
		}
		if len(b) > 8 {
			b = b[len(b)-8:]
		}
		var v uint64
		for _, x := range b {
			v = v<<8 | uint64(x)
		}
		return kv.EngineHash(v), nil
	}
	return 0, fmt.Errorf("%s: want integer or bytes, got msgpack code 0x%02x", what, c)
}

func (dec *decoder) hashes(what string) ([]kv.EngineHash, error) {
	n, err := dec.arrayLen(what)
	if err != nil {
		return nil, err
	}
	out := make([]kv.EngineHash, n)
	for i := range out {
		if out[i], err = dec.hash(what); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (dec *decoder) token(what string) (uint32, error) {
	v, err := dec.int64(what)
	if err != nil {
		return 0, err
	}
	if v < 0 || v > math.MaxUint32 {
		return 0, fmt.Errorf("%s: token id %d out of u32 range", what, v)
	}
	return uint32(v), nil
}

// tokens reads token_ids. Speculative-decoding engines (Eagle) may publish
// pairs; the first element of each pair is the token the block holds.
func (dec *decoder) tokens(what string) ([]uint32, error) {
	if isNil, err := dec.nextIsNil(); err != nil || isNil {
		return nil, err
	}
	n, err := dec.arrayLen(what)
	if err != nil {
		return nil, err
	}
	out := make([]uint32, n)
	i := 0
	if dec.buf != nil {
		// The ids straight from the bytes: a block's worth of tokens per
		// stored block makes this most of a batch's decoding.
		pos := len(dec.buf) - dec.r.Len()
		i, pos = plainTokens(dec.buf, pos, out)
		if _, err := dec.r.Seek(int64(pos), io.SeekStart); err != nil {
			return nil, err
		}
	}
	for ; i < len(out); i++ {
		c, err := dec.peek()
		if err != nil {
			return nil, err
		}
		if !isArray(c) {
			if out[i], err = dec.token(what); err != nil {
				return nil, err
			}
			continue
		}
		m, err := dec.arrayLen(what + " pair")
		if err != nil {
			return nil, err
		}
		if m == 0 {
			return nil, fmt.Errorf("%s: empty token pair", what)
		}
		if out[i], err = dec.token(what); err != nil {
			return nil, err
		}
		if err := dec.skipN(m - 1); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// plainTokens decodes the msgpack unsigned integers (any width, up to
// u32's range) at b[pos:] into out, stopping at the first element that is
// anything else (a pair, a negative or too large id, the end): the caller
// decodes from there. It returns how many it decoded and where it stopped.
func plainTokens(b []byte, pos int, out []uint32) (int, int) {
	for i := range out {
		if pos >= len(b) {
			return i, pos
		}
		c := b[pos]
		var v uint64
		var w int // bytes after the code
		switch {
		case c <= 0x7f: // positive fixint
			out[i] = uint32(c)
			pos++
			continue
		case c == msgpcode.Uint8 || c == msgpcode.Int8:
			w = 1
		case c == msgpcode.Uint16 || c == msgpcode.Int16:
			w = 2
		case c == msgpcode.Uint32 || c == msgpcode.Int32:
			w = 4
		case c == msgpcode.Uint64 || c == msgpcode.Int64:
			w = 8
		default:
			return i, pos
		}
		if pos+1+w > len(b) {
			return i, pos
		}
		for _, x := range b[pos+1 : pos+1+w] {
			v = v<<8 | uint64(x)
		}
		signed := c >= msgpcode.Int8 && c <= msgpcode.Int64
		if signed && b[pos+1]&0x80 != 0 || v > math.MaxUint32 {
			return i, pos // negative or out of range: the slow path says so
		}
		out[i] = uint32(v)
		pos += 1 + w
	}
	return len(out), pos
}

// skipN skips n values iteratively (no recursion), bounding nesting depth.
func (dec *decoder) skipN(n int) error {
	// pending[i] is how many values remain at nesting level i.
	var stack [maxSkipDepth]int
	depth := 0
	stack[0] = n
	for {
		for stack[depth] == 0 {
			if depth == 0 {
				return nil
			}
			depth--
		}
		stack[depth]--
		c, err := dec.peek()
		if err != nil {
			return err
		}
		var children int
		switch {
		case isArray(c):
			if children, err = dec.arrayLen("ignored field"); err != nil {
				return err
			}
		case isMap(c):
			m, err := dec.mapLen("ignored field")
			if err != nil {
				return err
			}
			children = 2 * m
		default:
			if err := dec.checkBytesLen(c, "ignored field"); err != nil {
				return err
			}
			if err := dec.skipExtLen(c); err != nil {
				return err
			}
			if err := dec.d.Skip(); err != nil {
				return fmt.Errorf("ignored field: %w", err)
			}
			continue
		}
		if children > 0 {
			if depth+1 >= maxSkipDepth {
				return fmt.Errorf("ignored field nested deeper than %d", maxSkipDepth)
			}
			depth++
			stack[depth] = children
		}
	}
}

// skipExtLen refuses ext headers that declare more bytes than are left.
func (dec *decoder) skipExtLen(c byte) error {
	var n int
	switch c {
	case msgpcode.Ext8:
		n = 1
	case msgpcode.Ext16:
		n = 2
	case msgpcode.Ext32:
		n = 4
	default:
		return nil
	}
	left := dec.r.Len()
	if left < 1+n {
		return errors.New("ignored field: truncated ext length")
	}
	var hdr [5]byte
	off := int64(dec.r.Size()) - int64(left)
	if _, err := dec.r.ReadAt(hdr[:1+n], off); err != nil {
		return err
	}
	var size int
	switch n {
	case 1:
		size = int(hdr[1])
	case 2:
		size = int(binary.BigEndian.Uint16(hdr[1:]))
	case 4:
		size = int(binary.BigEndian.Uint32(hdr[1:]))
	}
	if size > left-1-n {
		return fmt.Errorf("ignored field: ext of %d bytes but only %d left", size, left-1-n)
	}
	return nil
}

func (dec *decoder) float(what string) (float64, error) {
	c, err := dec.peek()
	if err != nil {
		return 0, err
	}
	switch {
	case c == msgpcode.Double || c == msgpcode.Float:
		v, err := dec.d.DecodeFloat64()
		if err != nil {
			return 0, fmt.Errorf("%s: %w", what, err)
		}
		return v, nil
	case isInt(c):
		v, err := dec.int64(what)
		return float64(v), err
	}
	return 0, fmt.Errorf("%s: want float, got msgpack code 0x%02x", what, c)
}

func (dec *decoder) batch() (*Batch, error) {
	c, err := dec.peek()
	if err != nil {
		return nil, err
	}
	b := &Batch{}
	switch {
	case isArray(c):
		n, err := dec.arrayLen("batch")
		if err != nil {
			return nil, err
		}
		if n < 2 {
			return nil, fmt.Errorf("batch array has %d fields, want at least 2 (ts, events)", n)
		}
		if b.TS, err = dec.float("batch ts"); err != nil {
			return nil, err
		}
		if b.Events, err = dec.events(); err != nil {
			return nil, err
		}
		if n >= 3 {
			if b.DPRank, b.HasDPRank, err = dec.optInt64("batch data_parallel_rank"); err != nil {
				return nil, err
			}
		}
		if n > 3 {
			if err := dec.skipN(n - 3); err != nil {
				return nil, err
			}
		}
	case isMap(c):
		n, err := dec.mapLen("batch")
		if err != nil {
			return nil, err
		}
		seenEvents := false
		for range n {
			k, err := dec.str("batch key")
			if err != nil {
				return nil, err
			}
			switch k {
			case keyTS:
				b.TS, err = dec.float("batch ts")
			case keyEvents:
				b.Events, err = dec.events()
				seenEvents = true
			case keyDPRank:
				b.DPRank, b.HasDPRank, err = dec.optInt64("batch data_parallel_rank")
			default:
				err = dec.skipN(1)
			}
			if err != nil {
				return nil, err
			}
		}
		if !seenEvents {
			return nil, errors.New("batch map has no events")
		}
	default:
		return nil, fmt.Errorf("batch: want array or map, got msgpack code 0x%02x", c)
	}
	if b.HasDPRank && (b.DPRank < 0 || b.DPRank > math.MaxUint32) {
		return nil, fmt.Errorf("batch data_parallel_rank %d out of range", b.DPRank)
	}
	return b, nil
}

func (dec *decoder) events() ([]Event, error) {
	n, err := dec.arrayLen("events")
	if err != nil {
		return nil, err
	}
	out := make([]Event, 0, n)
	for i := range n {
		ev, known, err := dec.event()
		if err != nil {
			return nil, fmt.Errorf("event %d: %w", i, err)
		}
		if !known {
			dec.stats.UnknownEvents++
			continue
		}
		out = append(out, ev)
	}
	return out, nil
}

func tagType(tag string) EventType {
	switch tag {
	case TagStored:
		return TypeStored
	case TagRemoved:
		return TypeRemoved
	case TagCleared:
		return TypeCleared
	}
	return 0
}

// event decodes one event; known is false for a well-formed event with an
// unknown tag, which the caller skips.
func (dec *decoder) event() (ev Event, known bool, err error) {
	c, err := dec.peek()
	if err != nil {
		return ev, false, err
	}
	switch {
	case isArray(c):
		return dec.arrayEvent()
	case isMap(c):
		return dec.mapEvent()
	}
	return ev, false, fmt.Errorf("want array or map, got msgpack code 0x%02x", c)
}

func (dec *decoder) arrayEvent() (ev Event, known bool, err error) {
	n, err := dec.arrayLen("event")
	if err != nil {
		return ev, false, err
	}
	if n == 0 {
		return ev, false, errors.New("empty event array (no tag)")
	}
	tag, err := dec.str("event tag")
	if err != nil {
		return ev, false, err
	}
	ev.Type = tagType(tag)
	var first []string // string extra keys of the first block
	// fields[i] decodes positional slot i+1.
	var fields []func() error
	switch ev.Type {
	case TypeStored:
		fields = []func() error{
			func() (err error) { ev.BlockHashes, err = dec.hashes(keyHashes); return },
			func() (err error) { ev.Parent, ev.HasParent, err = dec.optHash(keyParent); return },
			func() (err error) { ev.TokenIDs, err = dec.tokens(keyTokens); return },
			func() (err error) { ev.BlockSize, err = dec.blockSize(); return },
			func() (err error) { ev.LoRAID, ev.HasLoRAID, err = dec.optInt64(keyLoRAID); return },
			func() (err error) { ev.Medium, ev.HasMedium, err = dec.optStr(keyMedium); return },
			func() (err error) { ev.LoRAName, ev.HasLoRAName, err = dec.optStr(keyLoRAName); return },
			func() (err error) { first, err = dec.extraKeys(first); return },
		}
	case TypeRemoved:
		fields = []func() error{
			func() (err error) { ev.BlockHashes, err = dec.hashes(keyHashes); return },
			func() (err error) { ev.Medium, ev.HasMedium, err = dec.optStr(keyMedium); return },
		}
	case TypeCleared:
	default:
		return ev, false, dec.skipN(n - 1)
	}
	rest := n - 1
	for _, f := range fields {
		if rest == 0 {
			break
		}
		if err := f(); err != nil {
			return ev, false, err
		}
		rest--
	}
	if ev.Type != TypeCleared && n < 2 {
		return ev, false, fmt.Errorf("%s without block_hashes", tag)
	}
	ev.saltFromExtraKeys(first)
	return ev, true, dec.skipN(rest)
}

func (dec *decoder) mapEvent() (ev Event, known bool, err error) {
	n, err := dec.mapLen("event")
	if err != nil {
		return ev, false, err
	}
	tag, sawHashes := "", false
	var first []string // string extra keys of the first block
	for range n {
		k, err := dec.str("event key")
		if err != nil {
			return ev, false, err
		}
		switch k {
		case keyType:
			tag, err = dec.str("event type")
		case keyHashes:
			ev.BlockHashes, err = dec.hashes(keyHashes)
			sawHashes = true
		case keyParent:
			ev.Parent, ev.HasParent, err = dec.optHash(keyParent)
		case keyTokens:
			ev.TokenIDs, err = dec.tokens(keyTokens)
		case keyBlockSize:
			ev.BlockSize, err = dec.blockSize()
		case keyLoRAID:
			ev.LoRAID, ev.HasLoRAID, err = dec.optInt64(keyLoRAID)
		case keyMedium:
			ev.Medium, ev.HasMedium, err = dec.optStr(keyMedium)
		case keyLoRAName:
			ev.LoRAName, ev.HasLoRAName, err = dec.optStr(keyLoRAName)
		case keyExtraKeys:
			first, err = dec.extraKeys(first[:0])
		case keyCacheSalt:
			ev.CacheSalt, _, err = dec.optStr(keyCacheSalt)
		case keyLocality:
			ev.Locality, _, err = dec.optStr(keyLocality)
		default:
			err = dec.skipN(1)
		}
		if err != nil {
			return ev, false, err
		}
	}
	if tag == "" {
		return ev, false, errors.New("event map without a type")
	}
	ev.Type = tagType(tag)
	switch ev.Type {
	case 0:
		return Event{}, false, nil
	case TypeStored, TypeRemoved:
		if !sawHashes {
			return ev, false, fmt.Errorf("%s without block_hashes", tag)
		}
		if ev.Type == TypeStored {
			ev.saltFromExtraKeys(first)
		}
	case TypeCleared:
		ev = Event{Type: TypeCleared}
	}
	return ev, true, nil
}

func (dec *decoder) optHash(what string) (kv.EngineHash, bool, error) {
	if isNil, err := dec.nextIsNil(); err != nil || isNil {
		return 0, false, err
	}
	v, err := dec.hash(what)
	return v, err == nil, err
}

func (dec *decoder) blockSize() (int, error) {
	if isNil, err := dec.nextIsNil(); err != nil || isNil {
		return 0, err
	}
	v, err := dec.int64(keyBlockSize)
	if err != nil {
		return 0, err
	}
	if v < 0 || v > 1<<20 {
		return 0, fmt.Errorf("block_size %d out of range", v)
	}
	return int(v), nil
}

// extraKeys reads vLLM's extra_keys: nil, or one entry per block, each nil
// or a tuple of LoRA name, multimodal ids, cache_salt (a request's first
// block only) and prompt-embeds digests, in that order. It appends the
// top-level strings of the first block's tuple to dst and skips the rest;
// anything else in the slot is skipped, as before it was read at all.
func (dec *decoder) extraKeys(dst []string) ([]string, error) {
	c, err := dec.peek()
	if err != nil {
		return dst, err
	}
	if !isArray(c) {
		return dst, dec.skipN(1)
	}
	n, err := dec.arrayLen(keyExtraKeys)
	if err != nil || n == 0 {
		return dst, err
	}
	if c, err = dec.peek(); err != nil {
		return dst, err
	}
	if isArray(c) {
		m, err := dec.arrayLen(keyExtraKeys + " entry")
		if err != nil {
			return dst, err
		}
		for range m {
			if c, err = dec.peek(); err != nil {
				return dst, err
			}
			if !isStr(c) {
				if err := dec.skipN(1); err != nil {
					return dst, err
				}
				continue
			}
			s, err := dec.str(keyExtraKeys)
			if err != nil {
				return dst, err
			}
			dst = append(dst, s)
		}
		n--
	}
	return dst, dec.skipN(n)
}

// saltFromExtraKeys sets CacheSalt from the first block's string extra keys
// when no cache_salt key did. Only a store without a parent starts at a
// request's first block, the one vLLM adds the salt to; a leading string
// equal to lora_name is the LoRA key, and the salt is the last string
// after it (multimodal ids are (id, offset) tuples, embeds digests bytes).
func (ev *Event) saltFromExtraKeys(first []string) {
	if ev.CacheSalt != "" || ev.HasParent || len(first) == 0 {
		return
	}
	if ev.LoRAName != "" && first[0] == ev.LoRAName {
		first = first[1:]
	}
	if len(first) > 0 {
		ev.CacheSalt = first[len(first)-1]
	}
}
