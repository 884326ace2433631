package fleet

import (
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/workerclient"
)

// discoveryFollower is what else follows discovery: a model's event feed.
type discoveryFollower interface {
	OnDiscovery(discovery.Event)
}

// instances is the fleet's one instance table. Discovery feeds it, and it
// drives everything that follows the worker set, in one place and in one
// order: the router's workers (a key per DP rank), the client pool, and the
// model's event feed. The request path reads instances from it to dial.
type instances struct {
	router  *router.Router
	clients *workerclient.Pool
	log     *slog.Logger

	mu   sync.Mutex
	byID map[uint64]discovery.Instance
	// left is when each model last lost an instance; changed is closed,
	// and replaced, whenever an instance is added or removed.
	left    map[string]time.Time
	changed chan struct{}
	now     func() time.Time
	// tierLoad is what every worker's tiers cost to load (Config.TierLoad).
	tierLoad router.TierLoad
}

func newInstances(r *router.Router, clients *workerclient.Pool, log *slog.Logger) *instances {
	return &instances{router: r, clients: clients, log: log, byID: map[uint64]discovery.Instance{},
		left: map[string]time.Time{}, changed: make(chan struct{}), now: time.Now}
}

// notify wakes whoever waits for the table to change; called with t.mu held.
func (t *instances) notify() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// rejoin says whether model lost an instance less than window ago, and if
// so until when to wait for the table to change (changed is closed then).
func (t *instances) rejoin(model string, window time.Duration) (changed <-chan struct{}, until time.Time, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	left, had := t.left[model]
	if !had || window <= 0 {
		return nil, time.Time{}, false
	}
	until = left.Add(window)
	return t.changed, until, t.now().Before(until)
}

// apply takes one discovery event into the table and passes it on to the
// router, the client pool and feed (nil: none).
func (t *instances) apply(ev discovery.Event, feed discoveryFollower) {
	t.update(ev)
	if feed != nil {
		feed.OnDiscovery(ev)
	}
}

func (t *instances) update(ev discovery.Event) {
	in := ev.Instance
	if ev.Kind == discovery.InstanceRemoved {
		t.mu.Lock()
		delete(t.byID, in.ID)
		t.left[in.Model] = t.now()
		t.mu.Unlock()
		for _, k := range in.Workers() {
			t.router.RemoveWorker(k)
		}
		t.clients.Forget(in.ID)
		t.log.Info("worker removed", "instance", fmt.Sprintf("%x", in.ID), "model", in.Model)
		t.mu.Lock()
		t.notify()
		t.mu.Unlock()
		return
	}
	t.mu.Lock()
	prev, had := t.byID[in.ID]
	t.byID[in.ID] = in
	t.mu.Unlock()
	if had {
		// A re-registration with fewer DP ranks: the dropped ranks go.
		for _, k := range prev.Workers()[min(len(prev.Workers()), len(in.Workers())):] {
			t.router.RemoveWorker(k)
		}
	}
	for r, k := range in.Workers() {
		info := router.WorkerInfo{Key: k, Model: in.Model, Role: in.Role, BlockSize: in.BlockSize,
			KVBlocks: in.KVCapacity[kv.TierDevice.String()], MaxBatchedTokens: in.MaxBatchedTokens, Digest: in.Digest}
		if r < len(in.ControlEndpoints) {
			info.ControlEndpoint = in.ControlEndpoints[r]
		}
		info.HintCapable = in.HintTarget()
		info.LoRAs = in.LoRAs
		info.TierLoad = t.tierLoad
		info.DecodeOnly = in.DecodeOnly && in.Role == kv.RoleDecode
		info.NoKVEvents = in.NoKVEvents
		if err := t.router.AddWorker(info); err != nil {
			t.log.Warn("worker not routable", "instance", fmt.Sprintf("%x", in.ID), "err", err)
		}
	}
	t.log.Info("worker added", "instance", fmt.Sprintf("%x", in.ID), "model", in.Model, "grpc", in.GRPCAddr)
	t.mu.Lock()
	t.notify()
	t.mu.Unlock()
}

// get is the instance with id, if discovery lists it.
func (t *instances) get(id uint64) (discovery.Instance, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	in, ok := t.byID[id]
	return in, ok
}

// maxContext is the context every worker of model can hold: the smallest
// device KV capacity (blocks × block size) or engine context length
// (max_model_len) among them, so a request that passes fits wherever it is
// routed (0: no worker reports either).
func (t *instances) maxContext(model string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	limit := 0
	for _, in := range t.byID {
		if in.Model != model {
			continue
		}
		for _, n := range []int{in.KVCapacity[kv.TierDevice.String()] * in.BlockSize, in.MaxModelLen} {
			if n > 0 && (limit == 0 || n < limit) {
				limit = n
			}
		}
	}
	return limit
}

// loras lists, sorted, the LoRA adapters some worker of model serves.
func (t *instances) loras(model string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for _, in := range t.byID {
		if in.Model == model {
			out = append(out, in.LoRAs...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
