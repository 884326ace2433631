package kvbm

import (
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// FilterConfig tunes the disk admission filter; zero fields take Dynamo's
// defaults (threshold 2, decay every 600 s, 1,000,000 entries).
type FilterConfig struct {
	Disabled   bool // admit every host block to disk
	Threshold  uint32
	Interval   time.Duration
	MaxEntries int
}

func (c FilterConfig) normalize() FilterConfig {
	if c.Threshold == 0 {
		c.Threshold = 2
	}
	if c.Interval <= 0 {
		c.Interval = 600 * time.Second
	}
	if c.MaxEntries <= 0 {
		c.MaxEntries = 1_000_000
	}
	return c
}

// counterCap keeps doubling from overflowing; any value ≥ a sane
// threshold behaves the same.
const counterCap = 1 << 30

// FrequencyFilter is the disk tier's admission filter (SSD-wear
// protection): each sighting of a hash doubles its counter (a new hash
// starts at 1) and admits it once the counter reaches the threshold; every
// interval all counters drop by one and zeros are forgotten. Time comes
// from the caller, so it runs on any clock.
type FrequencyFilter struct {
	cfg       FilterConfig
	counts    map[kv.SeqHash]uint32
	lastDecay time.Time
}

// NewFrequencyFilter returns a filter whose decay windows start at now.
func NewFrequencyFilter(cfg FilterConfig, now time.Time) *FrequencyFilter {
	cfg = cfg.normalize()
	return &FrequencyFilter{cfg: cfg, counts: make(map[kv.SeqHash]uint32), lastDecay: now}
}

// ShouldOffload records one sighting of h at now and reports whether h may
// go to disk.
func (f *FrequencyFilter) ShouldOffload(h kv.SeqHash, now time.Time) bool {
	if f.cfg.Disabled {
		return true
	}
	if el := now.Sub(f.lastDecay); el >= f.cfg.Interval {
		steps := int64(el / f.cfg.Interval)
		f.decay(uint32(min(steps, counterCap)))
		f.lastDecay = f.lastDecay.Add(time.Duration(steps) * f.cfg.Interval)
	}
	c := f.counts[h]
	if c == 0 {
		c = 1
	} else {
		c = min(c*2, counterCap)
	}
	f.counts[h] = c
	for len(f.counts) > f.cfg.MaxEntries {
		f.decay(1)
	}
	return c >= f.cfg.Threshold
}

// Len is the number of hashes being counted.
func (f *FrequencyFilter) Len() int { return len(f.counts) }

func (f *FrequencyFilter) decay(by uint32) {
	for h, c := range f.counts {
		if c <= by {
			delete(f.counts, h)
		} else {
			f.counts[h] = c - by
		}
	}
}
