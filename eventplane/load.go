package eventplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvmesh/kvmesh/kv"

	"github.com/kvmesh/kvmesh/natsbus"
)

// LoadReport is one worker key's load, published periodically. A worker
// whose engine reports per-rank load publishes one report per DP rank, each
// with that rank's load and LastEventID.
type LoadReport struct {
	Instance             uint64 `json:"instance_id"`
	DPRank               uint32 `json:"dp_rank"`
	UsedBlocks           int    `json:"used_blocks"`
	TotalBlocks          int    `json:"total_blocks"`
	Running              int    `json:"running"`
	Waiting              int    `json:"waiting"`
	PendingPrefillTokens int    `json:"pending_prefill_tokens"`
	// LastEventID is the last KV event id the worker key (DPRank) produced,
	// so routers notice events lost at the end of the stream (0: unknown).
	LastEventID uint64 `json:"last_event_id,omitempty"`
	// LastEventIDs, when set, is the last KV event id of every DP rank of
	// the instance, indexed by rank (0: unknown), and supersedes
	// LastEventID: a worker with several ranks but no per-rank load
	// publishes one report (on rank 0) for all of them. Reports without it
	// (per-rank reports, older workers) announce LastEventID for DPRank.
	LastEventIDs []uint64 `json:"last_event_ids,omitempty"`
	// UnixNano is when the report was taken.
	UnixNano int64 `json:"ts"`
}

// LastEvents yields each worker key whose last event id the report
// announces, with that id; unknown (0) ids are skipped.
func (r LoadReport) LastEvents() iter.Seq2[kv.WorkerKey, uint64] {
	return func(yield func(kv.WorkerKey, uint64) bool) {
		if len(r.LastEventIDs) == 0 {
			if r.LastEventID != 0 {
				yield(kv.WorkerKey{Instance: r.Instance, DPRank: r.DPRank}, r.LastEventID)
			}
			return
		}
		for rank, id := range r.LastEventIDs {
			if id != 0 && !yield(kv.WorkerKey{Instance: r.Instance, DPRank: uint32(rank)}, id) {
				return
			}
		}
	}
}

// publishLoad publishes one report on the instance's load subject.
func publishLoad(nc *nats.Conn, model string, r LoadReport) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return nc.Publish(LoadSubject(model, r.Instance), b)
}

// RunLoadPublisher publishes sample() every interval until ctx ends.
// Publish errors (NATS away) are logged at most once per outage.
func RunLoadPublisher(ctx context.Context, nc *nats.Conn, model string, interval time.Duration, sample func() []LoadReport, log *slog.Logger) {
	if interval <= 0 {
		interval = time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var err error
		for _, r := range sample() {
			if r.UnixNano == 0 {
				r.UnixNano = time.Now().UnixNano()
			}
			err = errors.Join(err, publishLoad(nc, model, r))
		}
		if err != nil && !failing {
			log.Warn("load publish failing", "err", err)
		}
		failing = err != nil
	}
}

// maxLoadRanks bounds the per-rank ids one report may announce (discovery
// bounds dp_size at 1024).
const maxLoadRanks = 1024

// ParseLoadReport decodes a report as it arrives from the network and
// rejects values no worker sends: negative counts, more blocks used than
// held, a rank or a rank list past maxLoadRanks.
func ParseLoadReport(b []byte) (LoadReport, error) {
	var r LoadReport
	if err := json.Unmarshal(b, &r); err != nil {
		return LoadReport{}, fmt.Errorf("load report: %w", err)
	}
	switch {
	case r.UsedBlocks < 0 || r.TotalBlocks < 0 || r.Running < 0 || r.Waiting < 0 || r.PendingPrefillTokens < 0:
		return LoadReport{}, fmt.Errorf("load report of %x: negative count", r.Instance)
	case r.UsedBlocks > r.TotalBlocks:
		return LoadReport{}, fmt.Errorf("load report of %x: %d blocks used of %d", r.Instance, r.UsedBlocks, r.TotalBlocks)
	case r.DPRank >= maxLoadRanks || len(r.LastEventIDs) > maxLoadRanks:
		return LoadReport{}, fmt.Errorf("load report of %x: rank %d or %d rank ids past %d", r.Instance, r.DPRank, len(r.LastEventIDs), maxLoadRanks)
	}
	return r, nil
}

// SubscribeLoad calls fn for every load report of model. Reports that do
// not parse or do not match their subject are dropped and counted in bad
// (if non-nil).
func SubscribeLoad(nc *nats.Conn, model string, fn func(LoadReport), bad func(error)) (*nats.Subscription, error) {
	sub, err := nc.Subscribe(LoadSubjectAll(model), func(m *nats.Msg) {
		id, err := natsbus.ParseInstanceToken(m.Subject)
		var r LoadReport
		if err == nil {
			r, err = ParseLoadReport(m.Data)
		}
		if err == nil && r.Instance != id {
			err = fmt.Errorf("load report of instance %x on %s", r.Instance, m.Subject)
		}
		if err != nil {
			if bad != nil {
				bad(err)
			}
			return
		}
		fn(r)
	})
	if err != nil {
		return nil, fmt.Errorf("load: subscribe: %w", err)
	}
	return sub, nil
}
