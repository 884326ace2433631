package fleet

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/router"
)

// NoEventsWarning starts every warning about engines without KV events:
// the router predicts their caches from its own routing (kv-approx).
const NoEventsWarning = "router kv-approx: no KV events from the engines"

// noEventsWarnings names, per served model, the workers registered without
// KV events (discovery's no_kv_events) while the router routes by KV
// overlap: their picks are kv-approx, which the operator should know.
func (c *Cluster) noEventsWarnings() []string {
	if m := c.router.Mode(); m != router.ModeKV && m != router.ModeKVApprox {
		return nil
	}
	var out []string
	for _, model := range c.cfg.Models {
		blind, all := c.instances.withoutEvents(model)
		switch {
		case len(blind) == 0:
		case len(blind) == all:
			out = append(out, fmt.Sprintf("%s (model %s: none of its %d workers relays KV events; give them --kv-events)", NoEventsWarning, model, all))
		default:
			out = append(out, fmt.Sprintf("%s (model %s: %d of its %d workers relay none, instances %s; give them --kv-events)",
				NoEventsWarning, model, len(blind), all, strings.Join(blind, ", ")))
		}
	}
	return out
}

// withoutEvents lists, sorted, the instances of model registered without
// KV events, and counts all of the model's instances.
func (t *instances) withoutEvents(model string) (blind []string, all int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, in := range t.byID {
		if in.Model != model {
			continue
		}
		all++
		if in.NoKVEvents {
			blind = append(blind, natsbus.InstanceToken(in.ID))
		}
	}
	slices.Sort(blind)
	return blind, all
}
