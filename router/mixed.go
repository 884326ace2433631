package router

import "github.com/kvmesh/kvmesh/kv"

// PreferAggregated is the mixed-fleet choice: when model has aggregated
// workers beside its prefill and decode ones, a request goes whole to the
// aggregated pool while its workers carry no more open requests each than
// the decode workers (where a disaggregated request spends its life).
// False when either pool is empty.
func (r *Router) PreferAggregated(model string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	per := func(role kv.Role) (float64, bool) {
		p := r.pools[poolKey{model, role}]
		if p == nil || len(p.workers) == 0 {
			return 0, false
		}
		var n int64
		for _, w := range p.workers {
			n += w.load.requests
		}
		return float64(n) / float64(len(p.workers)), true
	}
	agg, ok := per(kv.RoleAggregated)
	if !ok {
		return false
	}
	dec, ok := per(kv.RoleDecode)
	return ok && agg <= dec
}
