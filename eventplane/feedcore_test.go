package eventplane

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/kv"
)

// The feed core's table tests: no NATS, no goroutines, no sleeps. Each step
// feeds one input and names the actions it must return, rendered by show.

type step struct {
	in   func(*FeedCore) []Action
	want string
}

func inst(id uint64, dp int) discovery.Instance {
	return discovery.Instance{ID: id, Model: "m", Role: "aggregated", GRPCAddr: fmt.Sprintf("10.0.0.%d:50051", id), DPSize: dp, BlockSize: 4}
}

func added(id uint64, dp int) func(*FeedCore) []Action {
	return func(c *FeedCore) []Action {
		return c.Discovery(discovery.Event{Kind: discovery.InstanceAdded, Instance: inst(id, dp)})
	}
}

func updated(in discovery.Instance) func(*FeedCore) []Action {
	return func(c *FeedCore) []Action {
		return c.Discovery(discovery.Event{Kind: discovery.InstanceUpdated, Instance: in})
	}
}

func removed(id uint64) func(*FeedCore) []Action {
	return func(c *FeedCore) []Action {
		return c.Discovery(discovery.Event{Kind: discovery.InstanceRemoved, Instance: discovery.Instance{ID: id, Model: "m"}})
	}
}

// ev is a live event of worker (instance, rank) with id.
func ev(instance uint64, rank uint32, id uint64) kv.Event {
	e := kv.Cleared(kv.WorkerKey{Instance: instance, DPRank: rank})
	e.ID = id
	return e
}

// batch is instance's batch of events on its own subject; ids are rank 0's.
func batch(instance uint64, ids ...uint64) func(*FeedCore) []Action {
	var evs []kv.Event
	for _, id := range ids {
		evs = append(evs, ev(instance, 0, id))
	}
	return events(instance, instance, evs...)
}

// events is a batch that says it is from batchOf, on instance's subject.
func events(instance, batchOf uint64, evs ...kv.Event) func(*FeedCore) []Action {
	return raw(EventSubject("m", instance), marshal(batchOf, evs))
}

func marshal(instance uint64, evs []kv.Event) []byte {
	b, err := proto.Marshal(&api.KvEventBatch{Instance: instance, Events: api.EventsToProto(evs)})
	if err != nil {
		panic(err)
	}
	return b
}

// local is instance's batch handed over in process (Local).
func local(instance uint64, evs ...kv.Event) func(*FeedCore) []Action {
	return func(c *FeedCore) []Action { return c.Batch(instance, evs) }
}

func raw(subject string, data []byte) func(*FeedCore) []Action {
	return func(c *FeedCore) []Action { return c.Message(subject, data) }
}

// load is a single-rank load report announcing rank 0's last id.
func load(instance, last uint64) func(*FeedCore) []Action {
	return report(LoadReport{Instance: instance, LastEventID: last})
}

func report(r LoadReport) func(*FeedCore) []Action {
	return func(c *FeedCore) []Action { return c.Load(r) }
}

// dumped answers fetch ticket of (instance, rank) with holdings reflecting
// last (n Stored events, which carry no id).
func dumped(instance uint64, rank uint32, ticket, last uint64, n int) func(*FeedCore) []Action {
	evs := make([]kv.Event, n)
	for i := range evs {
		evs[i] = kv.Stored(kv.WorkerKey{}, kv.TierDevice, nil, []kv.StoredBlock{{EngineHash: kv.EngineHash(i + 1), LocalHash: 1}})
	}
	return answer(Answer{Worker: kv.WorkerKey{Instance: instance, DPRank: rank}, Ticket: ticket, Events: evs, Last: last})
}

// ranged answers a range fetch with the events of ids.
func ranged(instance uint64, rank uint32, ticket uint64, ids ...uint64) func(*FeedCore) []Action {
	var evs []kv.Event
	for _, id := range ids {
		e := ev(0, 0, id) // the core stamps the worker
		evs = append(evs, e)
	}
	return answer(Answer{Worker: kv.WorkerKey{Instance: instance, DPRank: rank}, Ticket: ticket, Events: evs})
}

func tooOld(instance uint64, ticket uint64) func(*FeedCore) []Action {
	return answer(Answer{Worker: kv.WorkerKey{Instance: instance}, Ticket: ticket, TooOld: true})
}

func failed(instance uint64, rank uint32, ticket uint64) func(*FeedCore) []Action {
	return answer(Answer{Worker: kv.WorkerKey{Instance: instance, DPRank: rank}, Ticket: ticket, Err: errors.New("unavailable")})
}

func answer(a Answer) func(*FeedCore) []Action {
	return func(c *FeedCore) []Action { return c.Answer(a) }
}

// show renders actions as "kind worker details; …", workers as
// instance.rank, event ids in brackets (0: a dump's Stored event).
func show(acts []Action) string {
	var parts []string
	for _, a := range acts {
		w := fmt.Sprintf("%x.%d", a.Worker.Instance, a.Worker.DPRank)
		switch a.Kind {
		case ActApply:
			ids := make([]string, len(a.Events))
			for i, e := range a.Events {
				if e.Worker != a.Worker {
					return fmt.Sprintf("event %d of worker %v in an apply for %s", e.ID, e.Worker, w)
				}
				ids[i] = fmt.Sprint(e.ID)
			}
			parts = append(parts, fmt.Sprintf("apply %s [%s] last=%d", w, strings.Join(ids, " "), a.Last))
		case ActRemoveWorker:
			parts = append(parts, "remove "+w)
		case ActFetch:
			f := a.Fetch
			s := fmt.Sprintf("dump %s #%d", w, f.Ticket)
			if !f.Dump {
				s = fmt.Sprintf("range %s #%d [%d,%d]", w, f.Ticket, f.From, f.To)
			}
			if f.Delay > 0 {
				s += fmt.Sprintf(" after %v", f.Delay)
			}
			if f.Retry != nil {
				s += " retry"
			}
			if f.Worker != a.Worker || f.Instance.ID != a.Worker.Instance {
				s += " MISADDRESSED"
			}
			parts = append(parts, s)
		case ActBad:
			parts = append(parts, "bad")
		default:
			parts = append(parts, a.Kind.String())
		}
	}
	return strings.Join(parts, "; ")
}

// synced is instance 1 (one rank) discovered, dumped empty and fed ids 1–2.
var synced = []step{
	{added(1, 1), "dump 1.0 #1"},
	{dumped(1, 0, 1, 0, 0), "remove 1.0; apply 1.0 [] last=0"},
	{batch(1, 1, 2), "apply 1.0 [1 2] last=2"},
}

func TestFeedCore(t *testing.T) {
	for _, tc := range []struct {
		name     string
		maxQueue int
		steps    []step
		// stats are checked field by field where non-zero.
		stats FeedStats
		last  map[kv.WorkerKey]uint64 // LastID after the steps; absent: not caught up
	}{{
		name:  "in order",
		steps: append(synced[:3:3], step{batch(1, 3), "apply 1.0 [3] last=3"}, step{batch(1, 4, 5, 6), "apply 1.0 [4 5 6] last=6"}),
		stats: FeedStats{Batches: 3, Applied: 6, DumpRepairs: 1, InstancesAdded: 1},
		last:  map[kv.WorkerKey]uint64{{Instance: 1}: 6},
	}, {
		name:  "events before the discovery dump are covered by it",
		steps: []step{{batch(1, 1), ""}, {added(1, 1), "dump 1.0 #1"}, {batch(1, 3, 4), ""}, {dumped(1, 0, 1, 3, 2), "remove 1.0; apply 1.0 [0 0 4] last=4"}},
		stats: FeedStats{UnknownInstance: 1, Duplicates: 1, Applied: 1, DumpRepairs: 1},
		last:  map[kv.WorkerKey]uint64{{Instance: 1}: 4},
	}, {
		name:  "duplicates are skipped",
		steps: append(synced[:3:3], step{batch(1, 1, 2, 3), "apply 1.0 [3] last=3"}, step{batch(1, 3), ""}),
		stats: FeedStats{Duplicates: 3, Applied: 3},
		last:  map[kv.WorkerKey]uint64{{Instance: 1}: 3},
	}, {
		name: "gap then range repair; events meanwhile queue behind it",
		steps: append(synced[:3:3],
			step{batch(1, 5), "range 1.0 #2 [3,4]"},
			step{batch(1, 6, 7), ""},
			step{load(1, 9), ""}, // no second tail repair while one is in flight
			step{ranged(1, 0, 2, 3, 4), "apply 1.0 [3 4 5 6 7] last=7"}),
		stats: FeedStats{Gaps: 1, RangeRepairs: 1, Applied: 7},
		last:  map[kv.WorkerKey]uint64{{Instance: 1}: 7},
	}, {
		name: "a second gap in the queue waits for its own repair",
		steps: append(synced[:3:3],
			step{batch(1, 4), "range 1.0 #2 [3,3]"},
			step{batch(1, 5, 8, 9), ""},
			step{ranged(1, 0, 2, 3), "apply 1.0 [3 4 5] last=5; range 1.0 #3 [6,7]"},
			step{ranged(1, 0, 3, 6, 7), "apply 1.0 [6 7 8 9] last=9"}),
		stats: FeedStats{Gaps: 2, RangeRepairs: 2, Applied: 9},
		last:  map[kv.WorkerKey]uint64{{Instance: 1}: 9},
	}, {
		name: "gap repaired by a dump when the ring no longer has the range",
		steps: append(synced[:3:3],
			step{batch(1, 9), "range 1.0 #2 [3,8]"},
			step{batch(1, 11), ""},
			step{tooOld(1, 2), "dump 1.0 #3"},
			step{dumped(1, 0, 3, 10, 2), "remove 1.0; apply 1.0 [0 0 11] last=11"}),
		stats: FeedStats{Gaps: 1, DumpRepairs: 2, Duplicates: 1, Applied: 3},
		last:  map[kv.WorkerKey]uint64{{Instance: 1}: 11},
	}, {
		name: "a range answer that is not the range asked is an error",
		steps: append(synced[:3:3],
			step{batch(1, 6), "range 1.0 #2 [3,5]"},
			step{ranged(1, 0, 2, 3, 5), "range 1.0 #3 [3,5] after 100ms retry"},
			step{ranged(1, 0, 3, 3, 4, 5), "apply 1.0 [3 4 5 6] last=6"}),
		stats: FeedStats{RepairErrors: 1, RangeRepairs: 1},
		last:  map[kv.WorkerKey]uint64{{Instance: 1}: 6},
	}, {
		// Probe 3 of issue 23: a forged batch with id 2^40 for a real
		// worker made the feed retry its range repair forever.
		name: "a forged huge id: the worker answers short, a dump resets it, nothing is retried",
		steps: append(synced[:3:3],
			step{batch(1, 1<<40), "range 1.0 #2 [3,1099511627775]"},
			step{batch(1, 3), ""},
			step{ranged(1, 0, 2, 3), "dump 1.0 #3"},
			step{dumped(1, 0, 3, 3, 1), "remove 1.0; apply 1.0 [0] last=3"},
			step{batch(1, 4), "apply 1.0 [4] last=4"}),
		stats: FeedStats{UnfillableGaps: 1, DumpRepairs: 2, Gaps: 1},
		last:  map[kv.WorkerKey]uint64{{Instance: 1}: 4},
	}, {
		name: "a forged announcement: one dump, then the real reports start no repair",
		steps: append(synced[:3:3],
			step{load(1, 1<<40), ""},
			step{load(1, 1<<40), "range 1.0 #2 [3,1099511627776]"},
			step{ranged(1, 0, 2), "dump 1.0 #3"},
			step{dumped(1, 0, 3, 2, 0), "remove 1.0; apply 1.0 [] last=2"},
			step{load(1, 2), ""},
			step{load(1, 2), ""}),
		stats: FeedStats{UnfillableGaps: 1, TailGaps: 1},
		last:  map[kv.WorkerKey]uint64{{Instance: 1}: 2},
	}, {
		name: "failing repairs are retried with growing backoff, reset by success",
		steps: []step{
			{added(1, 1), "dump 1.0 #1"},
			{failed(1, 0, 1), "dump 1.0 #2 after 100ms retry"},
			{failed(1, 0, 2), "dump 1.0 #3 after 200ms retry"},
			{dumped(1, 0, 3, 2, 1), "remove 1.0; apply 1.0 [0] last=2"},
			{batch(1, 4), "range 1.0 #4 [3,3]"},
			{failed(1, 0, 4), "range 1.0 #5 [3,3] after 100ms retry"},
			{ranged(1, 0, 5, 3), "apply 1.0 [3 4] last=4"},
		},
		stats: FeedStats{RepairErrors: 3, DumpRepairs: 1, RangeRepairs: 1, Gaps: 1},
		last:  map[kv.WorkerKey]uint64{{Instance: 1}: 4},
	}, {
		name: "backoff stops growing at 5s",
		steps: []step{
			{added(1, 1), "dump 1.0 #1"},
			{failed(1, 0, 1), "dump 1.0 #2 after 100ms retry"},
			{failed(1, 0, 2), "dump 1.0 #3 after 200ms retry"},
			{failed(1, 0, 3), "dump 1.0 #4 after 400ms retry"},
			{failed(1, 0, 4), "dump 1.0 #5 after 800ms retry"},
			{failed(1, 0, 5), "dump 1.0 #6 after 1.6s retry"},
			{failed(1, 0, 6), "dump 1.0 #7 after 3.2s retry"},
			{failed(1, 0, 7), "dump 1.0 #8 after 5s retry"},
			{failed(1, 0, 8), "dump 1.0 #9 after 5s retry"},
		},
		stats: FeedStats{RepairErrors: 8},
	}, {
		name: "a failed tail repair with nothing queued becomes a dump",
		steps: append(synced[:3:3],
			step{load(1, 5), ""},
			step{load(1, 5), "range 1.0 #2 [3,5]"},
			step{failed(1, 0, 2), "dump 1.0 #3 after 100ms retry"},
			step{dumped(1, 0, 3, 5, 0), "remove 1.0; apply 1.0 [] last=5"}),
		stats: FeedStats{Gaps: 1, TailGaps: 1, RepairErrors: 1, DumpRepairs: 2},
		last:  map[kv.WorkerKey]uint64{{Instance: 1}: 5},
	}, {
		name: "late answers for a dropped instance are stale",
		steps: []step{
			{added(1, 1), "dump 1.0 #1"},
			{removed(1), "remove 1.0"},
			{dumped(1, 0, 1, 5, 1), ""},
			{batch(1, 6), ""},
			{load(1, 6), ""},
			{added(1, 1), "dump 1.0 #2"},
			{dumped(1, 0, 1, 5, 1), ""}, // the first incarnation's answer, late
			{dumped(1, 0, 2, 0, 0), "remove 1.0; apply 1.0 [] last=0"},
			{removed(1), "remove 1.0"},
			{removed(1), ""},
		},
		stats: FeedStats{StaleRepairs: 2, UnknownInstance: 1, InstancesAdded: 2, InstancesRemoved: 2},
		last:  map[kv.WorkerKey]uint64{},
	}, {
		name: "an instance that restarts (ids back to 1) is dropped and dumped again",
		steps: append(synced[:3:3],
			step{batch(1, 3, 4, 5), "apply 1.0 [3 4 5] last=5"},
			step{removed(1), "remove 1.0"},
			step{added(1, 1), "dump 1.0 #2"},
			step{batch(1, 1), ""},
			step{dumped(1, 0, 2, 1, 1), "remove 1.0; apply 1.0 [0] last=1"},
			step{batch(1, 2, 3), "apply 1.0 [2 3] last=3"}),
		stats: FeedStats{InstancesAdded: 2, InstancesRemoved: 1, DumpRepairs: 2, Duplicates: 1},
		last:  map[kv.WorkerKey]uint64{{Instance: 1}: 3},
	}, {
		name: "a new address keeps the holdings; a new DP size replaces them",
		steps: append(synced[:3:3],
			step{updated(discovery.Instance{ID: 1, Model: "m", Role: "aggregated", GRPCAddr: "10.9.9.9:1", DPSize: 1, BlockSize: 4}), ""},
			step{batch(1, 3), "apply 1.0 [3] last=3"},
			step{updated(inst(1, 2)), "remove 1.0; dump 1.0 #2; dump 1.1 #3"},
			step{dumped(1, 1, 3, 7, 1), "remove 1.1; apply 1.1 [0] last=7"}),
		stats: FeedStats{InstancesAdded: 2, DumpRepairs: 2},
		last:  map[kv.WorkerKey]uint64{{Instance: 1, DPRank: 1}: 7},
	}, {
		// A process restarted under the same id before its record expired
		// re-registers over it: no removal comes between.
		name: "a new incarnation under the same id replaces the holdings",
		steps: append(synced[:3:3],
			step{batch(1, 3), "apply 1.0 [3] last=3"},
			step{updated(discovery.Instance{ID: 1, Incarnation: 7, Model: "m", Role: "aggregated", GRPCAddr: "10.0.0.1:50051", DPSize: 1, BlockSize: 4}), "remove 1.0; dump 1.0 #2"},
			step{batch(1, 1), ""},
			step{dumped(1, 0, 2, 1, 1), "remove 1.0; apply 1.0 [0] last=1"},
			step{batch(1, 2), "apply 1.0 [2] last=2"}),
		stats: FeedStats{InstancesAdded: 2, DumpRepairs: 2, Duplicates: 1},
		last:  map[kv.WorkerKey]uint64{{Instance: 1}: 2},
	}, {
		name: "a load report announcing ids the feed has not seen repairs one report later",
		steps: append(synced[:3:3],
			step{load(1, 2), ""},
			step{load(1, 4), ""}, // 3 and 4 may be in flight
			step{batch(1, 3), "apply 1.0 [3] last=3"},
			step{load(1, 4), "range 1.0 #2 [4,4]"},
			step{ranged(1, 0, 2, 4), "apply 1.0 [4] last=4"},
			step{load(1, 4), ""},
			step{load(2, 9), ""},                                                 // unknown instance
			step{report(LoadReport{Instance: 1, DPRank: 3, LastEventID: 9}), ""}, // unknown rank
			step{report(LoadReport{Instance: 1, DPRank: 3, LastEventID: 9}), ""}),
		stats: FeedStats{Gaps: 1, TailGaps: 1, RangeRepairs: 1, Applied: 4},
		last:  map[kv.WorkerKey]uint64{{Instance: 1}: 4},
	}, {
		name: "DP ranks are separate keys",
		steps: []step{
			{added(1, 2), "dump 1.0 #1; dump 1.1 #2"},
			{dumped(1, 1, 2, 3, 1), "remove 1.1; apply 1.1 [0] last=3"},
			{events(1, 1, ev(1, 1, 4), ev(1, 0, 1), ev(1, 1, 6), ev(1, 1, 7)), "apply 1.1 [4] last=4; range 1.1 #3 [5,5]"},
			{dumped(1, 0, 1, 0, 0), "remove 1.0; apply 1.0 [1] last=1"},
			{events(1, 1, ev(1, 0, 1), ev(1, 0, 2)), "apply 1.0 [2] last=2"},
			{ranged(1, 1, 3, 5), "apply 1.1 [5 6 7] last=7"},
			{report(LoadReport{Instance: 1, LastEventID: 2, LastEventIDs: []uint64{2, 9}}), ""},
			{report(LoadReport{Instance: 1, LastEventID: 2, LastEventIDs: []uint64{2, 9}}), "range 1.1 #4 [8,9]"},
		},
		stats: FeedStats{Gaps: 2, TailGaps: 1, DumpRepairs: 2, RangeRepairs: 1, Applied: 6, Duplicates: 1},
		last:  map[kv.WorkerKey]uint64{{Instance: 1}: 2},
	}, {
		name:     "a queue past MaxQueue turns the repair into a dump",
		maxQueue: 2,
		steps: append(synced[:3:3],
			step{batch(1, 5, 6), "range 1.0 #2 [3,4]"},
			step{batch(1, 7, 8), ""},
			step{ranged(1, 0, 2, 3, 4), "dump 1.0 #3"},
			step{dumped(1, 0, 3, 6, 1), "remove 1.0; apply 1.0 [0 7 8] last=8"}),
		stats: FeedStats{QueueOverflows: 1, DumpRepairs: 2, Applied: 4},
		last:  map[kv.WorkerKey]uint64{{Instance: 1}: 8},
	}, {
		name: "bad messages are counted and skipped",
		steps: append(synced[:3:3],
			step{raw("kvmesh.events.m.nothex", nil), "bad"},
			step{raw(EventSubject("m", 1), []byte("\xff\xff garbage")), "bad"},
			step{events(1, 2, ev(2, 0, 3)), "bad"},
			step{events(1, 1, ev(2, 0, 3), ev(1, 5, 3), ev(1, 0, 0), ev(1, 0, 3)), "bad; bad; bad; apply 1.0 [3] last=3"},
			step{batch(9, 1), ""}),
		stats: FeedStats{BadMessages: 6, UnknownInstance: 1, Applied: 3},
		last:  map[kv.WorkerKey]uint64{{Instance: 1}: 3},
	}, {
		name: "in-process batches are ordered, repaired and checked as messages are",
		steps: append(synced[:3:3],
			step{local(1, ev(1, 0, 3), ev(1, 0, 4)), "apply 1.0 [3 4] last=4"},
			step{local(1, ev(1, 0, 4)), ""},
			step{local(1, ev(1, 0, 6)), "range 1.0 #2 [5,5]"},
			step{ranged(1, 0, 2, 5), "apply 1.0 [5 6] last=6"},
			step{local(1, ev(2, 0, 7), ev(1, 5, 7), ev(1, 0, 0), kv.Event{ID: 7, Worker: kv.WorkerKey{Instance: 1}, Kind: kv.EventStored},
				kv.Event{ID: 7, Worker: kv.WorkerKey{Instance: 1}, Kind: kv.EventCleared, Tier: kv.NumTiers}, kv.Event{ID: 7, Worker: kv.WorkerKey{Instance: 1}},
				ev(1, 0, 7)), "bad; bad; bad; bad; bad; bad; apply 1.0 [7] last=7"},
			step{local(9, ev(9, 0, 1)), ""}),
		stats: FeedStats{Batches: 5, Duplicates: 1, Gaps: 1, RangeRepairs: 1, BadMessages: 6, UnknownInstance: 1, Applied: 7},
		last:  map[kv.WorkerKey]uint64{{Instance: 1}: 7},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewFeedCore(tc.maxQueue)
			for i, s := range tc.steps {
				if got := show(s.in(c)); got != s.want {
					t.Fatalf("step %d: got\n\t%s\nwant\n\t%s", i, got, s.want)
				}
			}
			checkStats(t, c.Stats(), tc.stats)
			if tc.last != nil {
				for _, w := range []kv.WorkerKey{{Instance: 1}, {Instance: 1, DPRank: 1}} {
					got, ok := c.LastID(w)
					want, wok := tc.last[w]
					if ok != wok || got != want {
						t.Errorf("LastID(%v) = %d, %v; want %d, %v", w, got, ok, want, wok)
					}
				}
			}
		})
	}
}

// checkStats compares the non-zero fields of want.
func checkStats(t *testing.T, got, want FeedStats) {
	t.Helper()
	for _, f := range []struct {
		name      string
		got, want int64
	}{
		{"Batches", got.Batches, want.Batches}, {"Applied", got.Applied, want.Applied}, {"Duplicates", got.Duplicates, want.Duplicates},
		{"Gaps", got.Gaps, want.Gaps}, {"TailGaps", got.TailGaps, want.TailGaps}, {"RangeRepairs", got.RangeRepairs, want.RangeRepairs},
		{"DumpRepairs", got.DumpRepairs, want.DumpRepairs}, {"RepairErrors", got.RepairErrors, want.RepairErrors},
		{"QueueOverflows", got.QueueOverflows, want.QueueOverflows}, {"BadMessages", got.BadMessages, want.BadMessages},
		{"UnknownInstance", got.UnknownInstance, want.UnknownInstance}, {"InstancesAdded", got.InstancesAdded, want.InstancesAdded},
		{"InstancesRemoved", got.InstancesRemoved, want.InstancesRemoved}, {"StaleRepairs", got.StaleRepairs, want.StaleRepairs},
	} {
		if f.want != 0 && f.got != f.want {
			t.Errorf("%s = %d, want %d (all: %+v)", f.name, f.got, f.want, got)
		}
	}
}

// A fetch after an address change asks the new address.
func TestFeedCoreFetchUsesNewAddress(t *testing.T) {
	c := NewFeedCore(0)
	c.Discovery(discovery.Event{Kind: discovery.InstanceAdded, Instance: inst(1, 1)})
	moved := inst(1, 1)
	moved.GRPCAddr = "10.9.9.9:1"
	if acts := c.Discovery(discovery.Event{Kind: discovery.InstanceUpdated, Instance: moved}); len(acts) != 0 {
		t.Fatalf("address change: %s", show(acts))
	}
	acts := c.Answer(Answer{Worker: kv.WorkerKey{Instance: 1}, Ticket: 1, Err: errors.New("gone")})
	if len(acts) != 1 || acts[0].Fetch == nil || acts[0].Fetch.Instance.GRPCAddr != moved.GRPCAddr {
		t.Fatalf("retry after the move: %s (%+v)", show(acts), acts)
	}
}

// Against a simulated worker (a ring of ringSize events, failing some
// calls) and a lossy, duplicating stream, the core always converges on
// exactly the worker's holdings once the stream goes quiet and two load
// reports announce the last id.
func TestFeedCoreConverges(t *testing.T) {
	const ringSize = 8
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 11))
		w := kv.WorkerKey{Instance: 1}
		c := NewFeedCore(1 + rng.IntN(6))
		var produced uint64
		held := map[kv.EngineHash]bool{} // the router index: block hashes of w
		var fetches []*Fetch
		run := func(acts []Action) {
			for _, a := range acts {
				switch a.Kind {
				case ActApply:
					for _, e := range a.Events {
						for _, b := range e.Blocks {
							held[b.EngineHash] = true
						}
					}
				case ActRemoveWorker:
					clear(held)
				case ActFetch:
					fetches = append(fetches, a.Fetch)
				case ActBad:
					t.Fatalf("seed %d: bad %s: %v", seed, a.Where, a.Err)
				}
			}
		}
		event := func(id uint64) kv.Event {
			e := kv.Stored(w, kv.TierDevice, nil, []kv.StoredBlock{{EngineHash: kv.EngineHash(id), LocalHash: 1}})
			e.ID = id
			return e
		}
		answer := func(f *Fetch) Answer {
			a := Answer{Worker: f.Worker, Ticket: f.Ticket}
			switch {
			case rng.IntN(5) == 0:
				a.Err = errors.New("injected")
			case f.Dump:
				for id := uint64(1); id <= produced; id++ {
					e := event(id)
					e.ID = 0
					a.Events = append(a.Events, e)
				}
				a.Last = produced
			case f.From+ringSize <= produced:
				a.TooOld = true
			default:
				for id := f.From; id <= f.To; id++ {
					a.Events = append(a.Events, event(id))
				}
			}
			return a
		}
		answerOne := func() {
			i := rng.IntN(len(fetches))
			f := fetches[i]
			fetches = append(fetches[:i], fetches[i+1:]...)
			run(c.Answer(answer(f)))
		}
		run(c.Discovery(discovery.Event{Kind: discovery.InstanceAdded, Instance: inst(1, 1)}))
		for range 300 {
			switch r := rng.IntN(10); {
			case r < 6:
				produced++
				var evs []kv.Event
				switch rng.IntN(8) {
				case 0: // lost
				case 1:
					evs = []kv.Event{event(produced), event(produced)}
				default:
					evs = []kv.Event{event(produced)}
				}
				if len(evs) > 0 {
					run(c.Message(EventSubject("m", 1), marshal(1, evs)))
				}
			case r < 7:
				run(c.Load(LoadReport{Instance: 1, LastEventID: produced}))
			case len(fetches) > 0:
				answerOne()
			}
		}
		// Quiet stream: reports and answers until nothing is in flight.
		for range 1000 {
			if len(fetches) == 0 {
				if last, ok := c.LastID(w); ok && last == produced {
					break
				}
				run(c.Load(LoadReport{Instance: 1, LastEventID: produced}))
				continue
			}
			answerOne()
		}
		if last, ok := c.LastID(w); !ok || last != produced || len(held) != int(produced) {
			t.Fatalf("seed %d: last %d (caught up %v) of %d, %d blocks held; stats %+v", seed, last, ok, produced, len(held), c.Stats())
		}
		for id := uint64(1); id <= produced; id++ {
			if !held[kv.EngineHash(id)] {
				t.Fatalf("seed %d: block %d missing", seed, id)
			}
		}
	}
}
