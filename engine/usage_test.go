package engine

import (
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// TestUsageByTier: the split's total is always the cached total, the device
// share is what the other sources leave, and counts past the total are cut.
func TestUsageByTier(t *testing.T) {
	for _, c := range []struct {
		u    Usage
		want kv.CachedByTier
	}{
		{Usage{CachedTokens: 96}, kv.CachedByTier{kv.TierDevice: 96}},
		{Usage{CachedTokens: 160, HostCachedTokens: 32, DiskCachedTokens: 16, ObjectCachedTokens: 8, PeerCachedTokens: 64},
			kv.CachedByTier{kv.TierDevice: 40, kv.TierHost: 32, kv.TierDisk: 16, kv.TierExternal: 8, kv.PeerCached: 64}},
		{Usage{CachedTokens: 48, HostCachedTokens: 32, PeerCachedTokens: 32}, kv.CachedByTier{kv.TierHost: 16, kv.PeerCached: 32}},
		{Usage{CachedTokens: 16, HostCachedTokens: -5}, kv.CachedByTier{kv.TierDevice: 16}},
		{Usage{CachedTokens: -1, PeerCachedTokens: 4}, kv.CachedByTier{}},
	} {
		got := c.u.ByTier()
		if got != c.want {
			t.Errorf("%+v: got %v, want %v", c.u, got, c.want)
		}
		if got.Total() != max(c.u.CachedTokens, 0) {
			t.Errorf("%+v: total %d", c.u, got.Total())
		}
	}
}
