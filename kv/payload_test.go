package kv

import "testing"

func TestPayloadDeterministicAndVerified(t *testing.T) {
	for _, size := range []int{0, 1, 7, 8, 13, 256, 4096} {
		a := Payload(42, 3, size)
		b := Payload(42, 3, size)
		if string(a) != string(b) {
			t.Fatalf("size %d: payload not deterministic", size)
		}
		if err := VerifyPayload(a, 42, 3, Checksum(a)); err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		if size >= 8 && string(Payload(42, 4, size)) == string(a) {
			t.Fatalf("size %d: layer must change the payload", size)
		}
		if size >= 8 && string(Payload(43, 3, size)) == string(a) {
			t.Fatalf("size %d: sequence hash must change the payload", size)
		}
		if size > 0 {
			c := append([]byte(nil), a...)
			c[size/2] ^= 1
			if VerifyPayload(c, 42, 3, Checksum(a)) == nil {
				t.Fatalf("size %d: a flipped bit must fail verification", size)
			}
			if VerifyPayload(c, 42, 3, Checksum(c)) == nil {
				t.Fatalf("size %d: a flipped bit with a matching checksum must still fail", size)
			}
		}
	}
}

func TestTierFromMedium(t *testing.T) {
	cases := map[string]Tier{"GPU": TierDevice, "": TierDevice, "cpu_pinned": TierHost, "CPU_TIER2": TierDisk, "NVME": TierDisk, "REMOTE": TierExternal, "OBJECT": TierExternal}
	for m, want := range cases {
		if got, ok := TierFromMedium(m); !ok || got != want {
			t.Errorf("%q: %v %v, want %v", m, got, ok, want)
		}
	}
	// Every medium KVCR's inventory names (its CacheTier values and what
	// the engine adapters publish for them).
	for m, want := range map[string]Tier{"HBM": TierDevice, "FW_DRAM": TierHost, "DRAM": TierHost, "LOCAL_G2": TierHost,
		"CPU": TierHost, "STORAGE": TierDisk, "storage": TierDisk, "G3": TierDisk} {
		if got, ok := TierFromMedium(m); !ok || got != want {
			t.Errorf("KVCR %q: %v %v, want %v", m, got, ok, want)
		}
	}
	for _, m := range []string{"TAPE", "REMOTE_G2", "GPUX"} {
		if got, ok := TierFromMedium(m); ok || got.Valid() {
			t.Errorf("unknown medium %q: %v %v, want not ok and no valid tier (never a silent device)", m, got, ok)
		}
	}
	for i := 0; i < NumTiers; i++ {
		if p, err := ParseTier(Tier(i).String()); err != nil || p != Tier(i) {
			t.Errorf("round trip of %v: %v %v", Tier(i), p, err)
		}
	}
}

// NewChecksum over parts is Checksum of them joined, at part boundaries
// inside and across xxh3's stripes and blocks.
func TestNewChecksumParts(t *testing.T) {
	b := make([]byte, 5000)
	for i := range b {
		b[i] = byte(i*31 + i/7)
	}
	for _, cut := range [][]int{{0}, {1, 2}, {63, 64, 65}, {1024, 2048, 4000}, {4999}} {
		h := NewChecksum()
		prev := 0
		for _, c := range append(cut, len(b)) {
			h.Write(b[prev:c])
			prev = c
		}
		if got, want := h.Sum64(), Checksum(b); got != want {
			t.Fatalf("cut at %v: %016x, want %016x", cut, got, want)
		}
	}
}
