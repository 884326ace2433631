package eventplane

import "github.com/prometheus/client_golang/prometheus"

// feedCollector exports a Feed's counters, read at scrape time (the
// feed keeps them as atomics), labelled with the feed's model so several
// feeds can share one registry.
type feedCollector struct {
	f                                                         *Feed
	batches, applied, duplicates, gaps, repairs, repairErrors *prometheus.Desc
	overflows, bad, unknown, instances, staleRepairs, unfill  *prometheus.Desc
	localCopies                                               *prometheus.Desc
}

// Collector returns a prometheus.Collector of the feed's counters, with a
// constant label model; register it on the caller's registry.
func (f *Feed) Collector() prometheus.Collector {
	cl := prometheus.Labels{"model": f.cfg.Model}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("kvmesh_event_feed_"+name, help, labels, cl)
	}
	return &feedCollector{f: f,
		batches:      d("batches_total", "Event batches received from workers."),
		applied:      d("events_applied_total", "Events applied to the index in order (live and range-repaired)."),
		duplicates:   d("duplicate_events_total", "Events skipped because their id was already applied."),
		gaps:         d("gaps_total", "Gaps detected: an event id past the next expected one, or (kind=tail) a last id announced in a load report.", "kind"),
		repairs:      d("repairs_total", "Completed repairs: kind=range (missing ids from the worker's ring) or kind=dump (full holdings).", "kind"),
		repairErrors: d("repair_errors_total", "Repair calls that failed (and were retried with backoff)."),
		overflows:    d("queue_overflows_total", "Per-worker queues that overflowed during a repair (a dump follows)."),
		bad:          d("bad_messages_total", "Event messages or events that did not parse or did not belong on their subject."),
		unknown:      d("unknown_instance_messages_total", "Event batches from instances not (or no longer) discovered."),
		instances:    d("instance_changes_total", "Instances the feed started (change=added) or stopped (change=removed) following.", "change"),
		staleRepairs: d("stale_repairs_total", "Repair answers dropped because their instance was removed or replaced meanwhile."),
		unfill:       d("unfillable_gaps_total", "Gaps past the worker's own last id (forged or foreign events): the worker is reset from a dump instead of retried."),
		localCopies:  d("local_copies_skipped_total", "NATS messages on the subject of a worker of this process (serve's), whose batches come in process: skipped unread."),
	}
}

func (c *feedCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.batches, c.applied, c.duplicates, c.gaps, c.repairs, c.repairErrors,
		c.overflows, c.bad, c.unknown, c.instances, c.staleRepairs, c.unfill, c.localCopies} {
		ch <- d
	}
}

func (c *feedCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.f.Stats()
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(c.batches, s.Batches)
	counter(c.applied, s.Applied)
	counter(c.duplicates, s.Duplicates)
	counter(c.gaps, s.Gaps-s.TailGaps, "sequence")
	counter(c.gaps, s.TailGaps, "tail")
	counter(c.repairs, s.RangeRepairs, "range")
	counter(c.repairs, s.DumpRepairs, "dump")
	counter(c.repairErrors, s.RepairErrors)
	counter(c.overflows, s.QueueOverflows)
	counter(c.bad, s.BadMessages)
	counter(c.unknown, s.UnknownInstance)
	counter(c.instances, s.InstancesAdded, "added")
	counter(c.instances, s.InstancesRemoved, "removed")
	counter(c.staleRepairs, s.StaleRepairs)
	counter(c.unfill, s.UnfillableGaps)
	counter(c.localCopies, s.LocalCopies)
}
