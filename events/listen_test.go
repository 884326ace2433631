package events

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kv"
	"go.uber.org/goleak"
)

// lockedBuffer lets the test read what Listen wrote so far.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestListenPrintsJSONLines(t *testing.T) {
	defer goleak.VerifyNone(t, leakOpts...)
	p, err := NewPublisher(context.Background(), PublisherConfig{Endpoint: "tcp://127.0.0.1:0",
		ReplayEndpoint: "tcp://127.0.0.1:0", Shape: ShapeMapEvents, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	batches := []*Batch{
		{HasDPRank: true, DPRank: 1, Events: []Event{
			{Type: TypeStored, BlockHashes: []kv.EngineHash{18446744073709551615, 9223372036854775809}, Parent: 12345678901234567890, HasParent: true,
				TokenIDs: []uint32{1, 2, 3, 4294967295}, BlockSize: 2, Medium: "GPU", HasMedium: true, LoRAName: `ad"é`, HasLoRAName: true},
			{Type: TypeRemoved, BlockHashes: []kv.EngineHash{18446744073709551615}, Medium: "CPU", HasMedium: true}}},
		{Events: []Event{{Type: TypeCleared}, {Type: TypeStored, BlockHashes: []kv.EngineHash{1}, TokenIDs: []uint32{7, 8}},
			{Type: TypeStored, BlockHashes: []kv.EngineHash{2}, TokenIDs: []uint32{9}, BlockSize: 1, CacheSalt: `t"1`}}},
	}
	want := `{"seq":0,"dp_rank":1,"type":"stored","engine_hashes":[18446744073709551615,9223372036854775809],"parent":12345678901234567890,"token_ids":[1,2,3,4294967295],"block_size":2,"medium":"GPU","lora_name":"ad\"é"}
{"seq":0,"dp_rank":1,"type":"removed","engine_hashes":[18446744073709551615],"parent":null,"token_ids":[],"block_size":0,"medium":"CPU","lora_name":null}
{"seq":1,"dp_rank":0,"type":"cleared","engine_hashes":[],"parent":null,"token_ids":[],"block_size":0,"medium":null,"lora_name":null}
{"seq":1,"dp_rank":0,"type":"stored","engine_hashes":[1],"parent":null,"token_ids":[7,8],"block_size":0,"medium":null,"lora_name":null}
{"seq":1,"dp_rank":0,"type":"stored","engine_hashes":[2],"parent":null,"token_ids":[9],"block_size":1,"medium":null,"lora_name":null,"cache_salt":"t\"1"}
`
	for _, b := range batches {
		if _, err := p.PublishBatch(b); err != nil {
			t.Fatal(err)
		}
	}
	out := &lockedBuffer{}
	done := make(chan error, 1)
	go func() {
		_, err := Listen(context.Background(), ListenConfig{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(),
			Count: 5, Timeout: 10 * time.Second, Logger: quietLogger()}, out)
		done <- err
	}()
	var lerr error
	tickUntil(t, p, func() bool {
		select {
		case lerr = <-done:
			return true
		default:
			return false
		}
	})
	if lerr != nil {
		t.Fatal(lerr)
	}
	if got := out.String(); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

func TestListenTimeout(t *testing.T) {
	defer goleak.VerifyNone(t, leakOpts...)
	p := newTestPublisher(t, false)
	defer p.Close()
	var out bytes.Buffer
	n, err := Listen(context.Background(), ListenConfig{Endpoint: p.Endpoint(), Count: 5, Timeout: 300 * time.Millisecond, Logger: quietLogger()}, &out)
	if n != 0 || !errors.Is(err, ErrListenTimeout) || !strings.Contains(err.Error(), "saw 0 of 5 events") {
		t.Fatalf("n %d err %v", n, err)
	}
	// Without a count, the timeout is just the end of listening.
	if _, err := Listen(context.Background(), ListenConfig{Endpoint: p.Endpoint(), Timeout: 100 * time.Millisecond, Logger: quietLogger()}, &out); err != nil {
		t.Fatal(err)
	}
}
