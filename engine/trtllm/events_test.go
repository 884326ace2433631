package trtllm

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// block renders one stored_block of n tokens starting at first.
func block(hash uint64, first, n, level int) string {
	toks := make([]string, n)
	for i := range toks {
		toks[i] = fmt.Sprintf(`{"type":"unique_token","token_id":%d,"token_extra_id":0}`, first+i)
	}
	return fmt.Sprintf(`{"type":"stored_block","block_hash":%d,"tokens":[%s],"cache_level":%d,"priority":35}`, hash, strings.Join(toks, ","), level)
}

func TestConverter(t *testing.T) {
	c := newConverter(4)
	// created (two windows: the larger is the global attention's), a
	// chain of two full blocks and a partial one, a sliding-window store
	// that is dropped, and an event of another attention-DP rank.
	body := `[
	 {"event_id":0,"data":{"type":"created","num_blocks_per_cache_level":[100,50]},"window_size":512},
	 {"event_id":1,"data":{"type":"created","num_blocks_per_cache_level":[100,50]},"window_size":4096},
	 {"event_id":2,"data":{"type":"stored","parent_hash":null,"blocks":[` + block(18446744073709551615, 0, 4, 0) + `,` + block(7, 4, 4, 0) + `,` + block(8, 8, 2, 0) + `]},"window_size":4096},
	 {"event_id":3,"data":{"type":"stored","parent_hash":null,"blocks":[` + block(9, 0, 4, 0) + `]},"window_size":512},
	 {"event_id":0,"data":{"type":"stored","parent_hash":null,"blocks":[` + block(10, 0, 4, 0) + `]},"window_size":4096,"attention_dp_rank":1}
	]`
	evs, err := c.batch([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[0].Kind != kv.EventStored || evs[0].HasParent || len(evs[0].Blocks) != 2 || evs[0].Tier != kv.TierDevice {
		t.Fatalf("events %+v", evs)
	}
	b := evs[0].Blocks
	if b[0].EngineHash != kv.EngineHash(^uint64(0)) || b[1].EngineHash != 7 {
		t.Fatalf("engine hashes %v", b)
	}
	want := kv.NewHasher(4, "", "").Local([]kv.Token{0, 1, 2, 3, 4, 5, 6, 7})
	if b[0].LocalHash != want[0] || b[1].LocalHash != want[1] {
		t.Fatalf("local hashes %v, want %v", b, want)
	}
	if s := c.stats; s.TruncatedStores != 1 || s.DroppedEvents != 2 || s.Events != 4 || s.Cleared != 0 {
		t.Fatalf("stats %+v", s)
	}

	// An offload to the secondary pool moves the block to the host tier;
	// the partial block's removal is not relayed; a removal of the moved
	// block is a host removal.
	evs, _ = c.batch([]byte(`[
	 {"event_id":4,"data":{"type":"updated","block_hash":7,"cache_level":{"type":"event_diff","new_value":1,"old_value":0},"priority":null},"window_size":4096},
	 {"event_id":5,"data":{"type":"removed","block_hashes":[8,7]},"window_size":4096}
	]`))
	if len(evs) != 3 || evs[0].Kind != kv.EventRemoved || evs[0].Tier != kv.TierDevice ||
		evs[1].Kind != kv.EventStored || evs[1].Tier != kv.TierHost || !evs[1].HasParent || evs[1].Parent != kv.EngineHash(^uint64(0)) ||
		evs[2].Kind != kv.EventRemoved || evs[2].Tier != kv.TierHost || len(evs[2].Removed) != 1 || evs[2].Removed[0] != 7 {
		t.Fatalf("events %+v", evs)
	}

	// A gap (ids 6..8 dropped by an overflowing buffer) clears first.
	evs, _ = c.batch([]byte(`[{"event_id":9,"data":{"type":"removed","block_hashes":[18446744073709551615]},"window_size":4096}]`))
	if len(evs) != 2 || evs[0].Kind != kv.EventCleared || evs[1].Kind != kv.EventRemoved {
		t.Fatalf("events after a gap %+v", evs)
	}
	if s := c.stats; s.Gaps != 1 || s.Lost != 3 || s.Cleared != 1 {
		t.Fatalf("stats %+v", s)
	}
	// Ids going back: the engine restarted.
	evs, _ = c.batch([]byte(`[{"event_id":0,"data":{"type":"created","num_blocks_per_cache_level":[100]},"window_size":4096}]`))
	if len(evs) != 1 || evs[0].Kind != kv.EventCleared || c.stats.Restarts != 1 {
		t.Fatalf("events after a restart %+v, stats %+v", evs, c.stats)
	}
	// Malformed input is counted, never fatal.
	if _, err := c.batch([]byte(`{"not":"a list"}`)); err == nil || c.stats.Malformed != 1 {
		t.Fatalf("malformed: %v %+v", err, c.stats)
	}
	if evs, err := c.batch([]byte(`[]`)); err != nil || evs != nil {
		t.Fatalf("empty: %v %v", evs, err)
	}
}
