package main

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvmesh/kvmesh/router"
)

// queueFlags are the router queue's flags (--router-queue*, --admit-*).
type queueFlags struct {
	on        string
	policy    string
	limit     int
	maxWait   time.Duration
	lookahead int
	kvUsage   float64
	passes    float64
	waiting   float64
	waitW     float64
}

func addQueueFlags(f *pflag.FlagSet, q *queueFlags, defaultOn string) {
	f.StringVar(&q.on, "router-queue", defaultOn, "on: requests no worker can admit wait in the router's queue and are routed when one can (off: straight to the engines)")
	f.StringVar(&q.policy, "router-queue-policy", string(router.QueueFCFS), "router queue order: fcfs, wspt (shortest prefill first) or priority (the request's priority, lower first)")
	f.IntVar(&q.limit, "router-queue-limit", 0, "most requests the router queue holds; past it a request is refused (0: unbounded)")
	f.DurationVar(&q.maxWait, "router-queue-max-wait", router.DefaultQueueMaxWait, "age bound: a request that waited longer goes before every younger one, whatever the policy")
	f.IntVar(&q.lookahead, "router-queue-lookahead", router.DefaultQueueLookahead, "how many waiting requests one dispatch offers to the router, so one waiting for a busy worker does not block the rest")
	f.Float64Var(&q.kvUsage, "admit-kv-usage", router.DefaultAdmitKVUsage, "admission: a worker admits while its KV in use plus the request's new blocks stay within this fraction of its capacity (negative: off)")
	f.Float64Var(&q.passes, "admit-prefill-passes", router.DefaultAdmitPrefillPasses, "admission: a worker admits while the prefill queued on it is under this many passes of its max batched tokens (negative: off)")
	f.Float64Var(&q.waiting, "admit-waiting", router.DefaultAdmitWaiting, "admission: a worker admits while its engine reports at most this many waiting requests per running one (negative: off)")
	f.Float64Var(&q.waitW, "admit-wait-weight", router.DefaultAdmitWaitWeight, "admission (cost modes): weight of a busy worker's predicted wait for admission in its price; higher waits longer for the prefix holder, lower recomputes elsewhere sooner (negative: 0)")
}

// config is the queue's configuration, nil when --router-queue is off.
func (q *queueFlags) config() (*router.QueueConfig, *router.AdmitConfig, error) {
	switch strings.ToLower(strings.TrimSpace(q.on)) {
	case "off", "false", "0", "": // "": a flag set not registered (off)
		return nil, nil, nil
	case "on", "true", "1":
	default:
		return nil, nil, fmt.Errorf("--router-queue %q, want on or off", q.on)
	}
	pol, err := router.ParseQueuePolicy(q.policy)
	if err != nil {
		return nil, nil, fmt.Errorf("--router-queue-policy: %w", err)
	}
	if q.limit < 0 {
		return nil, nil, fmt.Errorf("--router-queue-limit %d, want ≥ 0 (0: unbounded)", q.limit)
	}
	if q.lookahead < 1 {
		return nil, nil, fmt.Errorf("--router-queue-lookahead %d, want ≥ 1", q.lookahead)
	}
	if q.maxWait <= 0 {
		return nil, nil, fmt.Errorf("--router-queue-max-wait %v, want > 0", q.maxWait)
	}
	for _, v := range []struct {
		name string
		v    float64
	}{{"admit-kv-usage", q.kvUsage}, {"admit-prefill-passes", q.passes}, {"admit-waiting", q.waiting}, {"admit-wait-weight", q.waitW}} {
		if math.IsNaN(v.v) || math.IsInf(v.v, 0) || v.v == 0 {
			return nil, nil, fmt.Errorf("--%s %g, want a finite number, not 0 (negative: off)", v.name, v.v)
		}
	}
	if q.kvUsage > 1 {
		return nil, nil, fmt.Errorf("--admit-kv-usage %g, want at most 1", q.kvUsage)
	}
	return &router.QueueConfig{Policy: pol, Limit: q.limit, MaxWait: q.maxWait, Lookahead: q.lookahead},
		&router.AdmitConfig{KVUsage: q.kvUsage, PrefillPasses: q.passes, Waiting: q.waiting, WaitWeight: q.waitW}, nil
}
