package api

import (
	"reflect"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
	"google.golang.org/protobuf/proto"
)

func TestEventRoundTrip(t *testing.T) {
	w := kv.WorkerKey{Instance: 0xdeadbeef, DPRank: 3}
	parent := kv.EngineHash(1 << 63)
	stored := kv.Stored(w, kv.TierHost, &parent, []kv.StoredBlock{{EngineHash: 1, LocalHash: 2}, {EngineHash: ^kv.EngineHash(0), LocalHash: 4}})
	stored.ID, stored.Tokens, stored.LoRA, stored.Salt = 9, []kv.Token{1, 2, 3, 4}, "ad", "tenant-7"
	removed := kv.Removed(w, kv.TierDisk, []kv.EngineHash{5, 6})
	removed.ID = 10
	cleared := kv.Cleared(w)
	cleared.ID = 11
	for _, e := range []kv.Event{stored, removed, cleared} {
		b, err := proto.Marshal(&KvEventBatch{Instance: w.Instance, Events: EventsToProto([]kv.Event{e})})
		if err != nil {
			t.Fatal(err)
		}
		var batch KvEventBatch
		if err := proto.Unmarshal(b, &batch); err != nil {
			t.Fatal(err)
		}
		got, err := EventsFromProto(batch.Events)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got[0], e) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got[0], e)
		}
	}
}

func TestEventFromProtoRejects(t *testing.T) {
	for name, p := range map[string]*KvEvent{
		"nil":          nil,
		"no kind":      {Id: 1},
		"bad tier":     {Id: 1, Kind: EventKind_EVENT_KIND_CLEARED, Tier: 7},
		"empty stored": {Id: 1, Kind: EventKind_EVENT_KIND_STORED},
		"unknown kind": {Id: 1, Kind: 99},
	} {
		if _, err := EventFromProto(p); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A hint crosses the worker API typed: every field survives the wire, and
// the hashes stay the source's, all 64 bits.
func TestHintRoundTrip(t *testing.T) {
	h := &kv.Hint{ID: "r1-2a", Source: kv.WorkerKey{Instance: 7, DPRank: 1}, Endpoint: "tcp://10.0.0.7:23280",
		Hashes: []kv.EngineHash{11, 1 << 63, ^kv.EngineHash(0)}}
	b, err := proto.Marshal(&GenerateRequest{RequestId: "x", KvFetch: HintToProto(h)})
	if err != nil {
		t.Fatal(err)
	}
	var req GenerateRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		t.Fatal(err)
	}
	if got := HintFromProto(req.KvFetch); !reflect.DeepEqual(got, h) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, h)
	}
	if HintToProto(nil) != nil || HintFromProto(nil) != nil {
		t.Fatal("nil hint did not stay nil")
	}
}

// TestSamplingRoundTrip fails when a field of kv.Sampling is not carried by
// the wire: every field is set non-zero (by reflection, so a new field is
// covered without editing this test, or fails it on a kind it cannot fill),
// sent through the protobuf encoding and read back.
func TestSamplingRoundTrip(t *testing.T) {
	var s kv.Sampling
	v := reflect.ValueOf(&s).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Int, reflect.Int64, reflect.Int32:
			f.SetInt(7) // valid for every count
		case reflect.Uint64, reflect.Uint32:
			f.SetUint(9)
		case reflect.Float64:
			f.SetFloat(0.5) // inside every sampling range: temperature, top_p, penalties
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Slice:
			if f.Type().Elem().Kind() != reflect.Uint32 {
				t.Fatalf("field %s: cannot fill a %s", v.Type().Field(i).Name, f.Type())
			}
			f.Set(reflect.ValueOf([]uint32{3, 4}).Convert(f.Type()))
		default:
			t.Fatalf("field %s: cannot fill a %s; teach this test", v.Type().Field(i).Name, f.Type())
		}
	}
	var req GenerateRequest
	SamplingToProto(&req, &s)
	b, err := proto.Marshal(&req)
	if err != nil {
		t.Fatal(err)
	}
	var back GenerateRequest
	if err := proto.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	got, err := SamplingFromProto(&back)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, s) {
		t.Fatalf("round trip lost a field:\n got %+v\nwant %+v", got, s)
	}
	// TopP 0 means "not set": it must stay absent so the engine's default applies.
	s.TopP = 0
	SamplingToProto(&req, &s)
	if req.TopP != nil {
		t.Fatalf("top_p 0 sent as %v", *req.TopP)
	}
}

func TestSamplingFromProtoRejects(t *testing.T) {
	f := func(x float64) *float64 { return &x }
	for want, req := range map[string]*GenerateRequest{
		"max_tokens must be ≥ 1":                  {},
		"temperature -1, want ≥ 0":                {MaxTokens: 1, Temperature: -1},
		"top_p 0, want in (0, 1]":                 {MaxTokens: 1, TopP: f(0)},
		"top_p 1.5, want in (0, 1]":               {MaxTokens: 1, TopP: f(1.5)},
		"presence_penalty 3, want in [-2, 2]":     {MaxTokens: 1, PresencePenalty: 3},
		"frequency_penalty -2.5, want in [-2, 2]": {MaxTokens: 1, FrequencyPenalty: -2.5},
		"min_tokens 3 exceeds max_tokens 2":       {MaxTokens: 2, MinTokens: 3},
	} {
		if _, err := SamplingFromProto(req); err == nil || err.Error() != want {
			t.Errorf("%+v: %v, want %q", req, err, want)
		}
	}
}

func TestLegRoundTrip(t *testing.T) {
	for _, l := range []kv.Leg{kv.LegWhole, kv.LegPrefill, kv.LegDecode} {
		if got, err := LegFromProto(LegToProto(l)); err != nil || got != l {
			t.Errorf("%v: got %v, %v", l, got, err)
		}
	}
	if _, err := LegFromProto(Leg(9)); err == nil {
		t.Error("unknown leg accepted")
	}
}

// TestUsageRoundTrip sends a usage with every source non-zero through the
// protobuf encoding, and checks what a worker without a split and a split
// past the total read back as.
func TestUsageRoundTrip(t *testing.T) {
	var c kv.CachedByTier
	for i := range c {
		c[i] = 16 * (i + 1)
	}
	b, err := proto.Marshal(UsageToProto(100, 5, c))
	if err != nil {
		t.Fatal(err)
	}
	var back Usage
	if err := proto.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.PromptTokens != 100 || back.CompletionTokens != 5 || int(back.CachedTokens) != c.Total() {
		t.Fatalf("totals: %+v", &back)
	}
	if got := CachedFromProto(&back); got != c {
		t.Fatalf("split: got %v, want %v", got, c)
	}
	if got := CachedFromProto(&Usage{PromptTokens: 64, CachedTokens: 48}); got != (kv.CachedByTier{kv.TierDevice: 48}) {
		t.Fatalf("a usage without a split: got %v, want all device", got)
	}
	over := CachedFromProto(&Usage{CachedTokens: 32, HostCachedTokens: 16, PeerCachedTokens: 64})
	if over.Total() != 32 || over[kv.PeerCached] != 32 || over[kv.TierHost] != 0 {
		t.Fatalf("a split past the total: got %v, want it cut to 32", over)
	}
	if got := CachedFromProto(nil); got != (kv.CachedByTier{}) {
		t.Fatalf("nil usage: %v", got)
	}
}
