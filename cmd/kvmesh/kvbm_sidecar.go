package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/kvbm"
	"github.com/kvmesh/kvmesh/kvbm/blobtier"
	"github.com/kvmesh/kvmesh/kvbm/sidecar"
)

// defaultStagingBlocks is --kvbm-staging-blocks' default: the blocks one
// engine step can load or store through the shared arena.
const defaultStagingBlocks = 256

// socketPath is --kvbm-socket, or the per-user default the Python package
// (kvmesh_kvbm) dials when KVMESH_KVBM_SOCKET is unset.
func (k *kvbmFlags) socketPath() string {
	if k.socket != "" {
		return k.socket
	}
	return filepath.Join("/tmp", fmt.Sprintf("kvmesh-kvbm-%d.sock", os.Getuid()))
}

// startSidecar serves a real engine's connector (package kvmesh_kvbm) on
// --kvbm-socket with the tiers the --kvbm-* flags describe; the engine's
// worker registering its KV cache creates them.
func (k *kvbmFlags) startSidecar(id uint64, log *slog.Logger) (*sidecar.Server, error) {
	cfg := sidecar.Config{Socket: k.socketPath(), Name: fmt.Sprintf("kvmesh-kvbm-%016x", id),
		HostBlocks: k.host, StagingBlocks: k.staging, DiskBlocks: k.disk, DiskFilter: kvbm.FilterConfig{Disabled: k.filterOff},
		ObjectBlocks: k.object, RecomputePerToken: k.recomputeCost(), Worker: kv.WorkerKey{Instance: id}, Logger: log}
	cfg.Bandwidth[kv.TierHost], cfg.Bandwidth[kv.TierDisk], cfg.Bandwidth[kv.TierExternal] = k.hostBW, k.diskBW, k.objBW
	if k.disk > 0 {
		dir := k.dir
		cfg.OpenDisk = func(slots, bb int) (sidecar.Storage, bool, error) {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, false, err
			}
			// Named like the sim's, so a restart under the same
			// --instance-id recovers it.
			d, err := kvbm.OpenDiskFile(filepath.Join(dir, fmt.Sprintf("kvbm-%016x-0.g3", id)), slots, bb)
			if err != nil {
				return nil, false, err
			}
			return d, d.Reopened, nil
		}
	}
	if k.objURL != "" {
		url, queue := k.objURL, k.objQueue
		cfg.OpenObject = func(slots, bb int) (sidecar.Storage, error) {
			return blobtier.OpenTier(context.Background(), url, fmt.Sprintf("kvbm/%016x-0/", id), slots, bb, queue)
		}
	}
	srv, err := sidecar.Listen(cfg)
	if err != nil {
		return nil, fmt.Errorf("--kvbm-socket: %w", err)
	}
	go func() {
		if err := srv.Serve(); err != nil {
			log.Error("kvbm sidecar stopped", "err", err)
		}
	}()
	log.Info("kvbm sidecar serving the engine's connector", "socket", srv.Addr(), "host_blocks", k.host, "disk_blocks", k.disk, "object_blocks", k.object)
	return srv, nil
}

// sidecarEvents makes the sidecar a worker event source: its tiers'
// events join the worker's stream.
type sidecarEvents struct{ s *sidecar.Server }

func (e sidecarEvents) SetEventSink(f engine.EventSink) { e.s.SetEventSink(f) }

// sidecarStats is the sidecar's totals in the shape the kvbm metrics read.
func sidecarStats(s *sidecar.Server) func() sim.KVBMStats {
	return func() sim.KVBMStats {
		st, protoErrs := s.Stats()
		return sim.KVBMStats{Stats: st, ConnectorErrors: protoErrs}
	}
}
