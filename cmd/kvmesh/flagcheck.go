package main

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/discovery"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/router"
)

// The packages behind the commands read a zero size as "use the default";
// on a command line a zero or negative size is a mistake, so the commands
// check their flags before they start anything and name the flag.

// intFlag is a flag's name, value and smallest accepted value.
type intFlag struct {
	name string
	v    int64
	min  int64
}

// checkInts returns an error naming the first flag below its minimum.
func checkInts(flags ...intFlag) error {
	for _, f := range flags {
		if f.v < f.min {
			return fmt.Errorf("--%s %d: want at least %d", f.name, f.v, f.min)
		}
	}
	return nil
}

// checkSimFlags checks the sim engine's flags shared by serve and worker.
func checkSimFlags(c sim.Config) error {
	if err := checkInts(
		intFlag{"block-size", int64(c.BlockSize), 1},
		intFlag{"blocks", int64(c.Blocks), 1},
		intFlag{"max-batched-tokens", int64(c.MaxBatchedTokens), 1},
		intFlag{"max-seqs", int64(c.MaxSeqs), 1},
	); err != nil {
		return err
	}
	if !(c.DecodeSpeedupRatio > 0) || math.IsInf(c.DecodeSpeedupRatio, 0) {
		return fmt.Errorf("--decode-speedup-ratio %g: want a finite number > 0", c.DecodeSpeedupRatio)
	}
	if !(c.SpeedupRatio >= 0) || math.IsInf(c.SpeedupRatio, 0) {
		return fmt.Errorf("--speedup-ratio %g: want a finite number ≥ 0 (0: no waiting)", c.SpeedupRatio)
	}
	return nil
}

// checkStallTimeout rejects a negative --stall-timeout (0 turns it off).
func checkStallTimeout(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("--stall-timeout %v: want ≥ 0 (0: off)", d)
	}
	return nil
}

// validate checks the frontend flags that need no NATS or workers.
func (ff *frontendFlags) validate() error {
	if err := checkInts(
		intFlag{"max-body-bytes", ff.maxBodyBytes, 1},
		intFlag{"migration-limit", int64(ff.migrationLimit), 0},
		intFlag{"max-tokens-limit", int64(ff.maxTokensLimit), 0},
	); err != nil {
		return err
	}
	for _, t := range []struct {
		flag string
		d    time.Duration
	}{{"read-header-timeout", ff.timeouts.ReadHeader}, {"read-body-timeout", ff.timeouts.ReadBody}, {"idle-timeout", ff.timeouts.Idle}} {
		if t.d < 0 {
			return fmt.Errorf("--%s %v: want ≥ 0 (0: no limit)", t.flag, t.d)
		}
	}
	// Keys are read here too, so a short one stops the command before
	// anything starts.
	if _, err := ff.auth.apiKeys(); err != nil {
		return err
	}
	if _, err := ff.auth.adminKeys(); err != nil {
		return err
	}
	if !(ff.temperature >= 0) || math.IsInf(ff.temperature, 0) {
		return fmt.Errorf("--router-temperature %g: want a finite number ≥ 0 (0: always the cheapest)", ff.temperature)
	}
	if ff.busyKVUsage < 0 || ff.busyKVUsage > 1 || math.IsNaN(ff.busyKVUsage) {
		return fmt.Errorf("--busy-kv-usage %g: want a fraction in [0, 1]", ff.busyKVUsage)
	}
	if _, _, err := ff.queue.config(); err != nil {
		return err
	}
	if ff.localPrefillTokens < 0 {
		return fmt.Errorf("--disagg-local-prefill-tokens %d: want ≥ 0 (0: never for length)", ff.localPrefillTokens)
	}
	if !(ff.localPrefillRatio > 0 && ff.localPrefillRatio <= 1) {
		return fmt.Errorf("--disagg-local-prefill-ratio %g: want a fraction in (0, 1]", ff.localPrefillRatio)
	}
	if _, err := router.ParseMode(ff.routerMode); err != nil {
		return fmt.Errorf("--router-mode: %w", err)
	}
	if ff.routerCost != "" {
		if _, err := router.ParseCostKind(ff.routerCost); err != nil {
			return fmt.Errorf("--router-cost: %w", err)
		}
	}
	if _, err := router.ParseTierLoad(ff.tierLoadMS); err != nil {
		return fmt.Errorf("--router-tier-load-ms: %w", err)
	}
	if _, err := ff.auth.apiKeys(); err != nil {
		return err
	}
	if _, err := ff.fleet.token(); err != nil {
		return err
	}
	if _, _, err := ff.tls.configs(); err != nil {
		return err
	}
	return nil
}

// checkLoRAFlag checks --lora: valid, distinct adapter names, none equal to
// the model's.
func checkLoRAFlag(loras []string, model string) error {
	for i, l := range loras {
		if err := discovery.ValidLoRAName(l); err != nil {
			return fmt.Errorf("--lora: %w", err)
		}
		if l == model || slices.Contains(loras[:i], l) {
			return fmt.Errorf("--lora %q: repeats --model or another adapter", l)
		}
	}
	return nil
}
