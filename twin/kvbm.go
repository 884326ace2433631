package twin

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvmesh/kvmesh/clock"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kvbm"
)

// ConnectorKVBM is the one connector the twin's workers can run: kvmesh's
// KV block manager (host and disk tiers behind each worker's device pool).
const ConnectorKVBM = "kvbm"

// KVBM is a twin run's block-manager shape (Config.KVBM).
type KVBM struct {
	HostBlocks int    `json:"host_blocks"`
	DiskBlocks int    `json:"disk_blocks,omitempty"`
	DiskDir    string `json:"-"` // per-worker pool files go here
	// Onboarding bandwidths, bytes/s (0: the sim's defaults, < 0: free).
	HostBandwidth float64 `json:"host_bandwidth,omitempty"`
	DiskBandwidth float64 `json:"disk_bandwidth,omitempty"`
	// DiskFilterOff admits every host block to disk.
	DiskFilterOff bool `json:"disk_filter_off,omitempty"`
	// The object tier (G4): its opener (each worker under its own
	// prefix), blocks per worker, onboarding bandwidth.
	Objects         sim.ObjectOpener `json:"-"`
	ObjectBlocks    int              `json:"object_blocks,omitempty"`
	ObjectBandwidth float64          `json:"object_bandwidth,omitempty"`
	// RecomputePerToken is the prefill cost per token a tier load is
	// weighed against (0: load every match, sim.RecomputeAuto: the sim's
	// timing model).
	RecomputePerToken time.Duration `json:"recompute_per_token,omitempty"`
}

// KVBMResult is what the workers' block managers did, summed.
type KVBMResult struct {
	HostTokens, DiskTokens uint64  // prompt tokens onboarded at first admission
	ObjectTokens           uint64  `json:"object_tokens,omitempty"`
	OffloadedObject        uint64  `json:"offloaded_object,omitempty"`
	OnboardedObject        uint64  `json:"onboarded_object,omitempty"`
	OffloadedHost          uint64  `json:"offloaded_host"`
	OffloadedDisk          uint64  `json:"offloaded_disk"`
	EvictedHost            uint64  `json:"evicted_host"`
	EvictedDisk            uint64  `json:"evicted_disk"`
	OnboardedHost          uint64  `json:"onboarded_host"` // blocks, every admission
	OnboardedDisk          uint64  `json:"onboarded_disk"`
	OnboardGiB             float64 `json:"onboard_gib"` // modelled
	Corrupt                uint64  `json:"corrupt"`
	Errors                 uint64  `json:"errors"`
	DeclinedLoad           uint64  `json:"declined_load,omitempty"` // matched blocks recomputed: cheaper than loading
}

func (k *KVBM) check() error {
	switch {
	case k.HostBlocks < 0 || k.DiskBlocks < 0:
		return errors.New("twin: kvbm block counts must not be negative")
	case k.HostBlocks == 0 && k.DiskBlocks == 0:
		return errors.New("twin: the kvbm connector needs host or disk blocks")
	case k.DiskBlocks > 0 && k.DiskDir == "":
		return errors.New("twin: kvbm disk blocks need a disk directory")
	case k.ObjectBlocks < 0 || (k.ObjectBlocks > 0) != (k.Objects != nil):
		return errors.New("twin: a kvbm object tier needs both its opener and its blocks")
	}
	return nil
}

// simKVBM is a worker's sim block-manager config; the disk filter decays
// on the twin's virtual clock.
func (k *KVBM) sim(vc clock.Clock) *sim.KVBMConfig {
	return &sim.KVBMConfig{HostBlocks: k.HostBlocks, DiskBlocks: k.DiskBlocks, DiskDir: k.DiskDir,
		HostBandwidth: k.HostBandwidth, DiskBandwidth: k.DiskBandwidth,
		DiskFilter: kvbm.FilterConfig{Disabled: k.DiskFilterOff}, Clock: vc,
		Objects: k.Objects, ObjectBlocks: k.ObjectBlocks, ObjectBandwidth: k.ObjectBandwidth,
		RecomputePerToken: k.RecomputePerToken}
}

// kvbmResult sums the workers' block-manager totals into the result and
// closes their disk files.
func (t *twin) kvbmResult() error {
	if t.cfg.KVBM == nil {
		return nil
	}
	var st sim.KVBMStats
	var errs []error
	for i := range t.ws {
		c := t.ws[i].core
		s := c.KVBMStats()
		st.HostTokens += s.HostTokens
		st.DiskTokens += s.DiskTokens
		st.ObjectTokens += s.ObjectTokens
		st.OffloadedObject += s.OffloadedObject
		st.OnboardedObject += s.OnboardedObject
		st.OffloadedHost += s.OffloadedHost
		st.OffloadedDisk += s.OffloadedDisk
		st.EvictedHost += s.EvictedHost
		st.EvictedDisk += s.EvictedDisk
		st.OnboardedHost += s.OnboardedHost
		st.OnboardedDisk += s.OnboardedDisk
		st.OnboardBytes += s.OnboardBytes
		st.Corrupt += s.Corrupt
		st.DeclinedLoad += s.DeclinedLoad
		st.Errors += s.Errors + s.ConnectorErrors
		if err := c.KVBMErr(); err != nil {
			errs = append(errs, fmt.Errorf("twin: worker %d: %w", i+1, err))
		}
		if err := c.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	t.res.KVBM = &KVBMResult{HostTokens: st.HostTokens, DiskTokens: st.DiskTokens, ObjectTokens: st.ObjectTokens,
		OffloadedObject: st.OffloadedObject, OnboardedObject: st.OnboardedObject,
		OffloadedHost: st.OffloadedHost, OffloadedDisk: st.OffloadedDisk,
		EvictedHost: st.EvictedHost, EvictedDisk: st.EvictedDisk,
		OnboardedHost: st.OnboardedHost, OnboardedDisk: st.OnboardedDisk,
		OnboardGiB: float64(st.OnboardBytes) / (1 << 30), Corrupt: st.Corrupt, Errors: st.Errors, DeclinedLoad: st.DeclinedLoad}
	return errors.Join(errs...)
}

// kvbmLine is the result's block-manager line, or "" without one.
func (r *Result) kvbmLine() string {
	k := r.KVBM
	if k == nil {
		return ""
	}
	obj := ""
	if k.OffloadedObject > 0 || k.OnboardedObject > 0 {
		obj = fmt.Sprintf("; object: offloaded %d, onboarded %d (%d prompt tokens)", k.OffloadedObject, k.OnboardedObject, k.ObjectTokens)
	}
	if k.DeclinedLoad > 0 {
		obj += fmt.Sprintf("; %d matched blocks recomputed (quicker than loading)", k.DeclinedLoad)
	}
	return fmt.Sprintf("  kvbm        offloaded %d host / %d disk blocks, evicted %d / %d, onboarded %d / %d (%.1f GiB modelled), %d corrupt, %d errors%s\n",
		k.OffloadedHost, k.OffloadedDisk, k.EvictedHost, k.EvictedDisk, k.OnboardedHost, k.OnboardedDisk, k.OnboardGiB, k.Corrupt, k.Errors, obj)
}
