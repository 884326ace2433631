package mockengine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// SGLang's disaggregation pairs a prefill and a decode request by a
// bootstrap room: both carry the prefill server's bootstrap_host and
// bootstrap_port and the same bootstrap_room, and the decode side asks the
// prefill's bootstrap server where that room's KV is. The stand-in serves
// that question on its side channel ("KB"): the decode names the room and
// how long it will wait, and the prefill answers, once the room's prompt is
// computed and leased, with its engine id, the side-channel port of the
// rank holding the blocks and their pool ids; the decode then pulls them as
// the vLLM stand-in does and notifies "room:<room>:1", which ends the lease.
//
// Wire (little-endian): request "KB", version 1, room u64, wait_ms u32;
// reply "KB", status u8, engine id (u16 length + bytes), port u16, count
// u32, count × pool id i32.

const (
	bootstrapVersion = 1
	bootOK           = 0
	bootUnknown      = 1 // no prefill for that room within the wait
	bootBad          = 2
	maxBootIDs       = 1 << 20
)

// RoomAnswer is where a bootstrap room's KV is.
type RoomAnswer struct {
	EngineID string
	Port     int     // side-channel port of the rank holding the blocks
	IDs      []int32 // pool ids, in prompt order
}

// RoomLookup answers a decode's bootstrap question, waiting (bounded by
// ctx) for the room's prefill.
type RoomLookup func(ctx context.Context, room uint64) (RoomAnswer, error)

// ErrNoRoom is a lookup's answer when no prefill took the room in time.
var ErrNoRoom = errors.New("no prefill holds that bootstrap room")

// SetRooms installs the bootstrap lookup (nil refuses lookups).
func (s *SideChannel) SetRooms(f RoomLookup) {
	if f == nil {
		s.rooms.Store(nil)
		return
	}
	s.rooms.Store(&f)
}

// RoomLeaseID names a room's lease (and its notification).
func RoomLeaseID(room uint64) string { return fmt.Sprintf("room:%d", room) }

func (s *SideChannel) serveBootstrap(ctx context.Context, c net.Conn) {
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var hdr [13]byte // version, room, wait_ms
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return
	}
	reply := func(status byte, a RoomAnswer) {
		buf := []byte{'K', 'B', status}
		buf = binary.LittleEndian.AppendUint16(buf, uint16(len(a.EngineID)))
		buf = append(buf, a.EngineID...)
		buf = binary.LittleEndian.AppendUint16(buf, uint16(a.Port))
		buf = binary.LittleEndian.AppendUint32(buf, uint32(len(a.IDs)))
		for _, id := range a.IDs {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(id))
		}
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_, _ = c.Write(buf)
	}
	p := s.rooms.Load()
	if hdr[0] != bootstrapVersion || p == nil {
		reply(bootBad, RoomAnswer{})
		return
	}
	room := binary.LittleEndian.Uint64(hdr[1:])
	wait := time.Duration(binary.LittleEndian.Uint32(hdr[9:])) * time.Millisecond
	_ = c.SetReadDeadline(time.Time{})
	lctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	a, err := (*p)(lctx, room)
	if err != nil {
		reply(bootUnknown, RoomAnswer{})
		return
	}
	reply(bootOK, a)
}

// LookupRoom asks the bootstrap server at addr (host:port) where room's KV
// is, letting it wait up to wait for the room's prefill.
func LookupRoom(ctx context.Context, addr string, room uint64, wait time.Duration) (RoomAnswer, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return RoomAnswer{}, fmt.Errorf("bootstrap %s: %w", addr, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	_ = c.SetDeadline(time.Now().Add(wait + 5*time.Second))
	buf := []byte{'K', 'B', bootstrapVersion}
	buf = binary.LittleEndian.AppendUint64(buf, room)
	buf = binary.LittleEndian.AppendUint32(buf, uint32(wait/time.Millisecond))
	if _, err := c.Write(buf); err != nil {
		return RoomAnswer{}, fmt.Errorf("bootstrap %s: %w", addr, err)
	}
	var head [5]byte
	if _, err := io.ReadFull(c, head[:]); err != nil {
		return RoomAnswer{}, fmt.Errorf("bootstrap %s: %w", addr, err)
	}
	if string(head[:2]) != "KB" {
		return RoomAnswer{}, fmt.Errorf("bootstrap %s: malformed reply", addr)
	}
	switch head[2] {
	case bootOK:
	case bootUnknown:
		return RoomAnswer{}, fmt.Errorf("bootstrap %s: room %d: %w", addr, room, ErrNoRoom)
	default:
		return RoomAnswer{}, fmt.Errorf("bootstrap %s: lookup refused (not a prefill server?)", addr)
	}
	idLen := int(binary.LittleEndian.Uint16(head[3:]))
	rest := make([]byte, idLen+6)
	if _, err := io.ReadFull(c, rest); err != nil {
		return RoomAnswer{}, fmt.Errorf("bootstrap %s: %w", addr, err)
	}
	a := RoomAnswer{EngineID: string(rest[:idLen]), Port: int(binary.LittleEndian.Uint16(rest[idLen:]))}
	n := binary.LittleEndian.Uint32(rest[idLen+2:])
	if n > maxBootIDs {
		return RoomAnswer{}, fmt.Errorf("bootstrap %s: %d pool ids", addr, n)
	}
	ids := make([]byte, 4*n)
	if _, err := io.ReadFull(c, ids); err != nil {
		return RoomAnswer{}, fmt.Errorf("bootstrap %s: %w", addr, err)
	}
	a.IDs = make([]int32, n)
	for i := range a.IDs {
		a.IDs[i] = int32(binary.LittleEndian.Uint32(ids[4*i:]))
	}
	return a, nil
}

// rooms is a prefill stand-in's bootstrap table: a room's answer once its
// prefill has leased the blocks. A lookup that arrives first waits for it.
type rooms struct {
	mu sync.Mutex
	m  map[uint64]*roomEntry
}

type roomEntry struct {
	ready   chan struct{}
	ans     RoomAnswer
	waiters int
}

func (r *rooms) entry(room uint64) *roomEntry {
	if r.m == nil {
		r.m = make(map[uint64]*roomEntry)
	}
	e := r.m[room]
	if e == nil {
		e = &roomEntry{ready: make(chan struct{})}
		r.m[room] = e
	}
	return e
}

// publish makes room's answer known.
func (r *rooms) publish(room uint64, a RoomAnswer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.entry(room)
	select {
	case <-e.ready:
		return // a room is answered once
	default:
	}
	e.ans = a
	close(e.ready)
}

// forget drops room (its lease ended).
func (r *rooms) forget(room uint64) {
	r.mu.Lock()
	delete(r.m, room)
	r.mu.Unlock()
}

// lookup waits for room's answer.
func (r *rooms) lookup(ctx context.Context, room uint64) (RoomAnswer, error) {
	r.mu.Lock()
	e := r.entry(room)
	e.waiters++
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		e.waiters--
		select {
		case <-e.ready:
		default:
			if e.waiters == 0 && r.m[room] == e {
				delete(r.m, room) // nobody prefilled it: do not keep the entry
			}
		}
		r.mu.Unlock()
	}()
	select {
	case <-e.ready:
		return e.ans, nil
	case <-ctx.Done():
		return RoomAnswer{}, ErrNoRoom
	}
}
