package kv

import (
	"fmt"
	"strings"
)

// Tier is where a block lives. Lower tiers are faster.
type Tier uint8

const (
	TierDevice   Tier = iota // G1: accelerator memory
	TierHost                 // G2: host (pinned) memory
	TierDisk                 // G3: local disk / NVMe
	TierExternal             // G4: remote or shared storage
	NumTiers     = 4
)

var tierNames = [NumTiers]string{"device", "host", "disk", "external"}

func (t Tier) String() string {
	if int(t) < NumTiers {
		return tierNames[t]
	}
	return fmt.Sprintf("tier(%d)", uint8(t))
}

// Valid reports whether t is one of the four known tiers.
func (t Tier) Valid() bool { return int(t) < NumTiers }

// ParseTier accepts a tier name as printed by String.
func ParseTier(s string) (Tier, error) {
	for i, n := range tierNames {
		if strings.EqualFold(s, n) {
			return Tier(i), nil
		}
	}
	return 0, fmt.Errorf("unknown tier %q (want device, host, disk or external)", s)
}

// TierFromMedium maps an engine's `medium` string (vLLM, SGLang, TRT-LLM,
// KVCR inventory) to a tier. An empty medium is the device. KVCR's own
// names are here too: its framework and local DRAM (FW_DRAM, DRAM,
// LOCAL_G2) are the host tier, and what it reports as STORAGE (its G3,
// file-backed) is the disk tier, as Dynamo's router reads it. An unknown
// medium gives ok false and an invalid tier, never the device: the caller
// drops the event and counts it.
func TierFromMedium(medium string) (t Tier, ok bool) {
	switch strings.ToUpper(strings.TrimSpace(medium)) {
	case "", "GPU", "DEVICE", "CUDA", "HBM", "FW_G1":
		return TierDevice, true
	case "CPU", "CPU_PINNED", "CPU_TIER1", "HOST", "HOST_PINNED", "DRAM", "FW_DRAM", "LOCAL_G2", "FW_G2":
		return TierHost, true
	case "CPU_TIER2", "DISK", "NVME", "SSD", "STORAGE", "G3":
		return TierDisk, true
	case "EXTERNAL", "NETWORK", "REMOTE", "SHARED", "OBJECT", "OBJECT_STORE", "S3":
		return TierExternal, true
	}
	return Tier(NumTiers), false
}
