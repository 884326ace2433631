package router

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/kvmesh/kvmesh/kv"
)

// ReplicaKind is the kind of a load change shared between router replicas.
type ReplicaKind uint8

const (
	ReplicaAdd        ReplicaKind = iota + 1 // a request was routed to Worker
	ReplicaFirstToken                        // its prefill finished
	ReplicaFree                              // it ended (done, error or cancel)
)

func (k ReplicaKind) String() string {
	switch k {
	case ReplicaAdd:
		return "add"
	case ReplicaFirstToken:
		return "first_token"
	case ReplicaFree:
		return "free"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// ReplicaEvent is one load change, published by the router that made it and
// applied by the others so every replica sees the whole fleet's load. Only
// active load is synced; cached blocks come from KV events.
type ReplicaEvent struct {
	Kind     ReplicaKind
	Router   string // the publishing replica; receivers drop their own
	Decision string // the decision id
	Worker   kv.WorkerKey
	// Add only: booked prefill tokens, unshareable blocks (partial tail)
	// and the prompt's sequence hashes (for unique-block accounting).
	PrefillTokens int64
	PrivateBlocks int64
	Blocks        []kv.SeqHash
}

// ApplyReplicaEvent applies another replica's load change. Events from this
// router itself, duplicates, and first-token/free events for decisions it
// never saw are ignored; malformed events are rejected.
func (r *Router) ApplyReplicaEvent(ev ReplicaEvent) error {
	if err := ev.validate(); err != nil {
		return err
	}
	if ev.Router == r.cfg.RouterID {
		return nil
	}
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	switch ev.Kind {
	case ReplicaAdd:
		if _, dup := r.active[ev.Decision]; dup {
			return nil
		}
		l := r.loads[ev.Worker]
		if l == nil {
			// Not (yet) discovered here: keep the load so it counts once the
			// worker registers; dropped again when it drains.
			l = &load{key: ev.Worker}
			r.loads[ev.Worker] = l
		}
		a := &active{
			id:      ev.Decision,
			load:    l,
			seq:     slices.Clone(ev.Blocks),
			private: ev.PrivateBlocks,
			prefill: ev.PrefillTokens,
			start:   now,
		}
		l.add(a, false)
		r.chg.Add(1)
		r.active[ev.Decision] = a
	case ReplicaFirstToken:
		if a := r.active[ev.Decision]; a != nil && !a.freed {
			a.load.prefillDone(a)
			r.chg.Add(1)
		}
	case ReplicaFree:
		if a := r.active[ev.Decision]; a != nil {
			r.freeLocked(a)
			delete(r.active, ev.Decision)
		}
	}
	return nil
}

var errReplica = errors.New("router: replica event")

func (ev *ReplicaEvent) validate() error {
	switch {
	case ev.Kind < ReplicaAdd || ev.Kind > ReplicaFree:
		return fmt.Errorf("%w: unknown kind %d", errReplica, ev.Kind)
	case ev.Router == "":
		return fmt.Errorf("%w: empty router id", errReplica)
	case ev.Decision == "":
		return fmt.Errorf("%w: empty decision id", errReplica)
	case ev.PrefillTokens < 0 || ev.PrivateBlocks < 0:
		return fmt.Errorf("%w: negative load", errReplica)
	case ev.Kind != ReplicaAdd && (ev.PrefillTokens != 0 || ev.PrivateBlocks != 0 || len(ev.Blocks) != 0):
		return fmt.Errorf("%w: %v carries load fields", errReplica, ev.Kind)
	}
	return nil
}

// Wire form (version 1), compact and self-delimiting:
//
//	u8 version=1, u8 kind, uvarint len+router, uvarint len+decision,
//	uvarint instance, uvarint dp rank,
//	add only: uvarint prefill tokens, uvarint private blocks,
//	          uvarint n, n × u64 LE sequence hashes.
const replicaWireVersion = 1

// maxReplicaString bounds ids on the wire.
const maxReplicaString = 256

// AppendBinary appends the wire form of ev to b.
func (ev *ReplicaEvent) AppendBinary(b []byte) ([]byte, error) {
	if err := ev.validate(); err != nil {
		return b, err
	}
	if len(ev.Router) > maxReplicaString || len(ev.Decision) > maxReplicaString {
		return b, fmt.Errorf("%w: id longer than %d bytes", errReplica, maxReplicaString)
	}
	b = append(b, replicaWireVersion, byte(ev.Kind))
	b = binary.AppendUvarint(b, uint64(len(ev.Router)))
	b = append(b, ev.Router...)
	b = binary.AppendUvarint(b, uint64(len(ev.Decision)))
	b = append(b, ev.Decision...)
	b = binary.AppendUvarint(b, ev.Worker.Instance)
	b = binary.AppendUvarint(b, uint64(ev.Worker.DPRank))
	if ev.Kind == ReplicaAdd {
		b = binary.AppendUvarint(b, uint64(ev.PrefillTokens))
		b = binary.AppendUvarint(b, uint64(ev.PrivateBlocks))
		b = binary.AppendUvarint(b, uint64(len(ev.Blocks)))
		for _, h := range ev.Blocks {
			b = binary.LittleEndian.AppendUint64(b, uint64(h))
		}
	}
	return b, nil
}

// MarshalBinary returns the wire form of ev.
func (ev *ReplicaEvent) MarshalBinary() ([]byte, error) {
	return ev.AppendBinary(make([]byte, 0, 32+8*len(ev.Blocks)))
}

// UnmarshalBinary decodes a wire form; trailing bytes are an error.
func (ev *ReplicaEvent) UnmarshalBinary(b []byte) error {
	d := wireReader{b: b}
	if v := d.byte(); v != replicaWireVersion {
		if d.err != nil {
			return d.err
		}
		return fmt.Errorf("%w: unsupported version %d", errReplica, v)
	}
	var out ReplicaEvent
	out.Kind = ReplicaKind(d.byte())
	out.Router = d.str()
	out.Decision = d.str()
	out.Worker.Instance = d.uvarint()
	rank := d.uvarint()
	if rank > 1<<32-1 && d.err == nil {
		d.err = fmt.Errorf("%w: dp rank %d out of range", errReplica, rank)
	}
	out.Worker.DPRank = uint32(rank)
	if out.Kind == ReplicaAdd {
		out.PrefillTokens = d.int63()
		out.PrivateBlocks = d.int63()
		n := d.uvarint()
		if d.err == nil && n > uint64(len(d.b)-d.off)/8 {
			d.err = fmt.Errorf("%w: %d blocks but %d bytes left", errReplica, n, len(d.b)-d.off)
		}
		if d.err == nil && n > 0 {
			out.Blocks = make([]kv.SeqHash, n)
			for i := range out.Blocks {
				out.Blocks[i] = kv.SeqHash(binary.LittleEndian.Uint64(d.b[d.off:]))
				d.off += 8
			}
		}
	}
	if d.err != nil {
		return d.err
	}
	if d.off != len(d.b) {
		return fmt.Errorf("%w: %d trailing bytes", errReplica, len(d.b)-d.off)
	}
	if err := out.validate(); err != nil {
		return err
	}
	*ev = out
	return nil
}

type wireReader struct {
	b   []byte
	off int
	err error
}

func (d *wireReader) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated or malformed %s at byte %d", errReplica, what, d.off)
	}
}

func (d *wireReader) byte() byte {
	if d.err != nil || d.off >= len(d.b) {
		d.fail("header")
		return 0
	}
	d.off++
	return d.b[d.off-1]
}

func (d *wireReader) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b[d.off:])
	if n <= 0 {
		d.fail("varint")
		return 0
	}
	d.off += n
	return v
}

func (d *wireReader) int63() int64 {
	v := d.uvarint()
	if v > 1<<63-1 {
		d.fail("count")
		return 0
	}
	return int64(v)
}

func (d *wireReader) str() string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > maxReplicaString || n > uint64(len(d.b)-d.off) {
		d.fail("string")
		return ""
	}
	s := string(d.b[d.off : d.off+int(n)])
	d.off += int(n)
	return s
}
