package twin

import (
	"strings"
	"testing"
)

// TestKVBMHostTierRaisesHit replays the trace slice on workers with a
// device pool too small for its reuse, with and without a host tier and
// with a disk tier behind it: the tiers' hits show up in the split, the
// same requests complete, and kv+hints works with them.
func TestKVBMHostTierRaisesHit(t *testing.T) {
	wl := loadSlice(t)
	base := Config{Mode: "kv", Workers: 4, Blocks: 512, Seed: 1}
	off := run(t, wl, base)
	on := base
	on.KVBM = &KVBM{HostBlocks: 8192}
	host := run(t, wl, on)
	checkResult(t, off)
	if off.KVBM != nil || off.Hit.HostTokens != 0 {
		t.Fatalf("no connector, yet %+v host tokens %d", off.KVBM, off.Hit.HostTokens)
	}
	h := host.Hit
	if host.Requests != off.Requests || h.HostTokens == 0 || !(h.Total > off.Hit.Total) {
		t.Fatalf("host tier: %d requests, hit %+v; without: %d requests, hit %.4f", host.Requests, h, off.Requests, off.Hit.Total)
	}
	if h.DeviceTokens+h.HostTokens+h.DiskTokens > h.PromptTokens || h.DeviceTokens < 0 {
		t.Fatalf("hit tokens %+v", h)
	}
	k := host.KVBM
	if k == nil || k.OffloadedHost == 0 || k.OnboardedHost == 0 || k.Errors != 0 || k.Corrupt != 0 {
		t.Fatalf("kvbm totals %+v", k)
	}
	var sum strings.Builder
	if err := host.WriteSummary(&sum); err != nil {
		t.Fatal(err)
	}
	if s := sum.String(); !strings.Contains(s, "kvbm        offloaded") || strings.Contains(s, "workers run no KVBM tier") {
		t.Fatalf("summary:\n%s", s)
	}

	disk := base
	disk.Mode = ModeKVHints
	// At the default 7 GB/s an 8 MiB modelled block loads slower than its
	// 64 tokens recompute, so the connector would decline every disk
	// match: a faster drive makes the disk tier worth loading from.
	disk.KVBM = &KVBM{HostBlocks: 256, DiskBlocks: 8192, DiskDir: t.TempDir(), DiskFilterOff: true, DiskBandwidth: 20e9}
	d := run(t, wl, disk)
	if d.Hit.DiskTokens == 0 || d.KVBM.OffloadedDisk == 0 || d.KVBM.Errors != 0 || d.Requests != off.Requests {
		t.Fatalf("disk tier: hit %+v, kvbm %+v", d.Hit, d.KVBM)
	}
}
