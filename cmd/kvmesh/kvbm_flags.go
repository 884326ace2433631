package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/kvbm"
	"github.com/kvmesh/kvmesh/kvbm/blobtier"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/twin"
)

// kvbmFlags are the KV block manager's flags, shared by worker, serve and
// twin (--connector kvbm turns it on).
type kvbmFlags struct {
	connector      string
	host, disk     int
	dir            string
	hostBW, diskBW float64
	filterOff      bool
	objURL         string
	object         int
	objBW          float64
	objQueue       int
	recompute      string
	socket         string // a real engine's connector: the sidecar's Unix socket
	staging        int
}

// defaultObjectQueue is --kvbm-object-queue's default: blocks staged in
// memory for the object tier's writers.
const defaultObjectQueue = 128

func addKVBMFlags(f *pflag.FlagSet, k *kvbmFlags) {
	f.StringVar(&k.connector, "connector", "", "KV connector: kvbm (host and disk tiers behind the device pool; prefill and aggregated workers only); empty: none")
	f.IntVar(&k.host, "kvbm-host-blocks", 0, "kvbm: host tier (G2) blocks per engine rank")
	f.IntVar(&k.disk, "kvbm-disk-blocks", 0, "kvbm: disk tier (G3) blocks per engine rank (without host blocks: straight from the device)")
	f.StringVar(&k.dir, "kvbm-disk-dir", "", "kvbm: directory of the disk tier's pool files; a restart with the same --instance-id recovers them")
	f.Float64Var(&k.hostBW, "kvbm-host-bandwidth", sim.DefaultHostBandwidth, "kvbm: host→device onboarding bandwidth, bytes/s (negative: free)")
	f.Float64Var(&k.diskBW, "kvbm-disk-bandwidth", sim.DefaultDiskBandwidth, "kvbm: disk→device onboarding bandwidth, bytes/s (negative: free)")
	f.BoolVar(&k.filterOff, "kvbm-disk-filter-off", false, "kvbm: offload every host block to disk, not only those seen twice within the filter's decay window")
	f.StringVar(&k.objURL, "kvbm-object-url", "", "kvbm: object tier (G4) bucket, file:///dir, mem:// or s3://bucket[/prefix]?region=…[&endpoint=…&use_path_style=true] (AWS credentials from the standard chain); keeps what host/disk evict, recovered at restart under the same --instance-id")
	f.IntVar(&k.object, "kvbm-object-blocks", 0, "kvbm: object tier blocks per engine rank (with --kvbm-object-url)")
	f.IntVar(&k.objQueue, "kvbm-object-queue", defaultObjectQueue, "kvbm: evicted blocks waiting for their object writes (staged in memory; a full queue drops the object copy, counted); 0: write synchronously (the twin always does)")
	f.StringVar(&k.recompute, "kvbm-recompute-per-token", "off", "kvbm: weigh each tier load against recomputing its tokens at this prefill cost per token (a duration, or auto: the engine's own prefill model); a match loads only as far as loading, behind the loads already queued, is quicker; off: load every match")
	f.Float64Var(&k.objBW, "kvbm-object-bandwidth", sim.DefaultObjectBandwidth, "kvbm: object→device onboarding bandwidth, bytes/s (negative: free)")
}

// addKVBMSidecarFlags are the flags of a real engine's connector sidecar
// (worker only).
func addKVBMSidecarFlags(f *pflag.FlagSet, k *kvbmFlags) {
	f.StringVar(&k.socket, "kvbm-socket", "", "kvbm, real engine: the Unix socket (mode 0600) the engine's kvmesh_kvbm connector calls (default /tmp/kvmesh-kvbm-<uid>.sock, what the package dials without KVMESH_KVBM_SOCKET)")
	f.IntVar(&k.staging, "kvbm-staging-blocks", defaultStagingBlocks, "kvbm, real engine: blocks of the shared arena (/dev/shm) one engine step loads or stores through; a step's excess is recomputed or left uncached, counted")
}

// check validates the flags of the sim's in-process KVBM; role is the
// worker's (decode workers run no connector).
func (k *kvbmFlags) check(role kv.Role) error { return k.checkFor("sim", role) }

// checkFor validates the flags for an engine kind: the sim runs the block
// manager in-process, a real engine through its connector sidecar
// (startSidecar); both take every tier flag, and a bucket is probed.
func (k *kvbmFlags) checkFor(engine string, role kv.Role) error {
	switch k.connector {
	case "":
		if k.host != 0 || k.disk != 0 || k.dir != "" || k.filterOff ||
			k.hostBW != sim.DefaultHostBandwidth || k.diskBW != sim.DefaultDiskBandwidth ||
			k.objURL != "" || k.object != 0 || k.objBW != sim.DefaultObjectBandwidth || k.objQueue != defaultObjectQueue || (k.recompute != "" && k.recompute != "off") {
			return fmt.Errorf("--kvbm-* flags need --connector kvbm")
		}
		return nil
	case twin.ConnectorKVBM:
	default:
		return fmt.Errorf("--connector %q: want kvbm (or empty for none)", k.connector)
	}
	if role == kv.RoleDecode {
		return fmt.Errorf("--connector kvbm: a decode worker runs no connector (its prompt KV comes from its prefill peer); run kvbm on the prefill workers")
	}
	if err := checkInts(intFlag{"kvbm-host-blocks", int64(k.host), 0}, intFlag{"kvbm-disk-blocks", int64(k.disk), 0},
		intFlag{"kvbm-object-blocks", int64(k.object), 0}, intFlag{"kvbm-object-queue", int64(k.objQueue), 0}); err != nil {
		return err
	}
	if k.host == 0 && k.disk == 0 {
		return fmt.Errorf("--connector kvbm: give --kvbm-host-blocks or --kvbm-disk-blocks")
	}
	if engine != "sim" {
		if k.recompute == "auto" {
			return fmt.Errorf("--kvbm-recompute-per-token auto: the sim's prefill model; with --engine %s give the engine's prefill cost per token (e.g. 20us) or off", engine)
		}
		if err := checkInts(intFlag{"kvbm-staging-blocks", int64(k.staging), 1}); err != nil {
			return err
		}
	}
	if k.disk > 0 && k.dir == "" {
		return fmt.Errorf("--kvbm-disk-blocks %d: give --kvbm-disk-dir", k.disk)
	}
	switch {
	case k.object > 0 && k.objURL == "":
		return fmt.Errorf("--kvbm-object-blocks %d: give --kvbm-object-url", k.object)
	case k.objURL != "" && k.object == 0:
		return fmt.Errorf("--kvbm-object-url %q: give --kvbm-object-blocks", k.objURL)
	case k.objURL != "":
		if err := blobtier.CheckURL(k.objURL); err != nil {
			return fmt.Errorf("--kvbm-object-url %w", err)
		}
	}
	for _, v := range []struct {
		name string
		v    float64
	}{{"kvbm-host-bandwidth", k.hostBW}, {"kvbm-disk-bandwidth", k.diskBW}, {"kvbm-object-bandwidth", k.objBW}} {
		if v.v == 0 || math.IsNaN(v.v) || math.IsInf(v.v, 0) {
			return fmt.Errorf("--%s %g: want a finite non-zero number (negative: free)", v.name, v.v)
		}
	}
	if _, err := parseRecompute(k.recompute); err != nil {
		return err
	}
	// A remote bucket is tried now, within blobtier.ProbeTimeout, so a
	// missing bucket or a bad credential stops the start, named.
	if k.objURL != "" && blobtier.Remote(k.objURL) {
		if err := blobtier.Probe(context.Background(), k.objURL); err != nil {
			return fmt.Errorf("--kvbm-object-url %q: %w", k.objURL, err)
		}
	}
	return nil
}

// parseRecompute reads --kvbm-recompute-per-token: off (0), auto
// (sim.RecomputeAuto) or a positive duration.
func parseRecompute(s string) (time.Duration, error) {
	switch s {
	case "off", "":
		return 0, nil
	case "auto":
		return sim.RecomputeAuto, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("--kvbm-recompute-per-token %q: want off, auto or a positive duration (e.g. 20us)", s)
	}
	return d, nil
}

// recomputeCost is the checked flag's value.
func (k *kvbmFlags) recomputeCost() time.Duration {
	d, _ := parseRecompute(k.recompute)
	return d
}

// sim is the sim engine's block-manager config, nil without the connector.
func (k *kvbmFlags) sim() *sim.KVBMConfig {
	if k.connector == "" {
		return nil
	}
	return &sim.KVBMConfig{HostBlocks: k.host, DiskBlocks: k.disk, DiskDir: k.dir,
		HostBandwidth: k.hostBW, DiskBandwidth: k.diskBW, DiskFilter: kvbm.FilterConfig{Disabled: k.filterOff},
		Objects: k.objects(k.objQueue), ObjectBlocks: k.object, ObjectBandwidth: k.objBW,
		RecomputePerToken: k.recomputeCost()}
}

// twin is the twin's block-manager config, nil without the connector.
func (k *kvbmFlags) twin() *twin.KVBM {
	if k.connector == "" {
		return nil
	}
	return &twin.KVBM{HostBlocks: k.host, DiskBlocks: k.disk, DiskDir: k.dir,
		HostBandwidth: k.hostBW, DiskBandwidth: k.diskBW, DiskFilterOff: k.filterOff,
		Objects: k.objects(0), ObjectBlocks: k.object, ObjectBandwidth: k.objBW, RecomputePerToken: k.recomputeCost()}
}

// objects opens the object tier at --kvbm-object-url (nil without one),
// its writes behind a queue of queue blocks (0: synchronous, as the twin
// writes).
func (k *kvbmFlags) objects(queue int) sim.ObjectOpener {
	if k.objURL == "" {
		return nil
	}
	url := k.objURL
	return func(prefix string, slots, blockBytes int) (sim.ObjectTier, error) {
		// Not the command's context: queued writes drain when the engine
		// closes, after the command's context has ended.
		return blobtier.OpenTier(context.Background(), url, prefix, slots, blockBytes, queue)
	}
}

// randomInstanceID is a worker instance id chosen before the engine starts
// (the disk tier's file is named by it): non-zero, positive as int64.
func randomInstanceID() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])>>1 | 1
}

// registerKVBMMetrics exposes block-manager totals (a sim engine's, or a
// real engine's connector sidecar's) on reg, labelled like the worker's
// own series.
func registerKVBMMetrics(reg prometheus.Registerer, stats func() sim.KVBMStats, model string, instance uint64) error {
	cl := prometheus.Labels{"model": model, "instance": natsbus.InstanceToken(instance)}
	type series struct {
		name, help string
		gauge      bool
		v          func(sim.KVBMStats) uint64
	}
	var cs []prometheus.Collector
	for _, s := range []series{
		{"kvmesh_kvbm_host_blocks", "Blocks the host tier (G2) holds.", true, func(s sim.KVBMStats) uint64 { return uint64(s.HostBlocks) }},
		{"kvmesh_kvbm_disk_blocks", "Blocks the disk tier (G3) holds.", true, func(s sim.KVBMStats) uint64 { return uint64(s.DiskBlocks) }},
		{"kvmesh_kvbm_offloaded_host_blocks_total", "Blocks written to the host tier.", false, func(s sim.KVBMStats) uint64 { return s.OffloadedHost }},
		{"kvmesh_kvbm_offloaded_disk_blocks_total", "Blocks written to the disk tier.", false, func(s sim.KVBMStats) uint64 { return s.OffloadedDisk }},
		{"kvmesh_kvbm_onboarded_host_blocks_total", "Blocks loaded from the host tier onto the device, verified.", false, func(s sim.KVBMStats) uint64 { return s.OnboardedHost }},
		{"kvmesh_kvbm_onboarded_disk_blocks_total", "Blocks loaded from the disk tier onto the device, verified.", false, func(s sim.KVBMStats) uint64 { return s.OnboardedDisk }},
		{"kvmesh_kvbm_evicted_host_blocks_total", "Blocks evicted from the host tier.", false, func(s sim.KVBMStats) uint64 { return s.EvictedHost }},
		{"kvmesh_kvbm_evicted_disk_blocks_total", "Blocks evicted from the disk tier.", false, func(s sim.KVBMStats) uint64 { return s.EvictedDisk }},
		{"kvmesh_kvbm_object_blocks", "Blocks the object tier (G4) holds.", true, func(s sim.KVBMStats) uint64 { return uint64(s.ObjectBlocks) }},
		{"kvmesh_kvbm_offloaded_object_blocks_total", "Blocks written to the object tier (evicted from the last local tier).", false, func(s sim.KVBMStats) uint64 { return s.OffloadedObject }},
		{"kvmesh_kvbm_onboarded_object_blocks_total", "Blocks loaded from the object tier (through host) onto the device, verified.", false, func(s sim.KVBMStats) uint64 { return s.OnboardedObject }},
		{"kvmesh_kvbm_evicted_object_blocks_total", "Blocks evicted from the object tier (their objects deleted).", false, func(s sim.KVBMStats) uint64 { return s.EvictedObject }},
		{"kvmesh_kvbm_pending_object_blocks", "Evicted blocks whose object writes are queued or running.", true, func(s sim.KVBMStats) uint64 { return uint64(s.PendingObject) }},
		{"kvmesh_kvbm_dropped_object_blocks_total", "Object writes dropped because the queue was full (--kvbm-object-queue).", false, func(s sim.KVBMStats) uint64 { return s.DroppedObject }},
		{"kvmesh_kvbm_failed_object_blocks_total", "Object writes that failed or failed verification (the block is not in the object tier).", false, func(s sim.KVBMStats) uint64 { return s.FailedObject }},
		{"kvmesh_kvbm_declined_load_blocks_total", "Matched tier blocks recomputed instead of loaded: loading them was slower (--kvbm-recompute-per-token).", false, func(s sim.KVBMStats) uint64 { return s.DeclinedLoad }},
		{"kvmesh_kvbm_recovered_object_blocks_total", "Object-tier blocks found intact at start (same instance and bucket).", false, func(s sim.KVBMStats) uint64 { return s.RecoveredObject }},
		{"kvmesh_kvbm_recovered_disk_blocks_total", "Disk blocks found intact at start (same instance and disk directory).", false, func(s sim.KVBMStats) uint64 { return s.RecoveredDisk }},
		{"kvmesh_kvbm_corrupt_blocks_total", "Blocks whose bytes failed their checksum (at onboarding or recovery), dropped.", false, func(s sim.KVBMStats) uint64 { return s.Corrupt }},
		{"kvmesh_kvbm_errors_total", "Block-manager storage, device or connector errors.", false, func(s sim.KVBMStats) uint64 { return s.Errors + s.ConnectorErrors }},
	} {
		f := func() float64 { return float64(s.v(stats())) }
		if s.gauge {
			cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: s.name, Help: s.help, ConstLabels: cl}, f))
		} else {
			cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: s.name, Help: s.help, ConstLabels: cl}, f))
		}
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
