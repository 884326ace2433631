package eventplane

import (
	"log/slog"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
)

// maxEventsPerAnswer bounds one Events answer; the client asks again for
// the rest.
const maxEventsPerAnswer = 4096

// Publisher is a worker's event-plane sink: each engine batch is
// stamped and recorded in the EventLog and published on the instance's
// subject as an api.KvEventBatch, in id order.
type Publisher struct {
	nc       *nats.Conn
	model    string
	subject  string
	local    *Local // nil: NATS only
	instance uint64
	log      *EventLog
	logger   *slog.Logger

	batches, events, failures atomic.Int64
}

// NewPublisher returns a publisher for one instance of model.
func NewPublisher(nc *nats.Conn, model string, log *EventLog, logger *slog.Logger) *Publisher {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Publisher{nc: nc, model: model, subject: EventSubject(model, log.instance), instance: log.instance, log: log, logger: logger}
}

// Sink is the engine.EventSink: it never blocks on the network (NATS
// buffers while reconnecting); a lost batch is a gap the routers repair.
//
// Stored events leave without their token ids (dropped in place: the
// sink owns the batch): the plane's reader, the router's index, keys
// blocks by the local hashes already computed from them, and a 14k-token
// prompt's ids were four fifths of its batch's bytes, copied through NATS,
// decoded by every router and kept in the log's ring.
func (p *Publisher) Sink(batch []kv.Event) {
	for i := range batch {
		batch[i].Tokens = nil
	}
	p.log.Append(batch, p.publish)
}

// UseLocal makes this worker's batches reach this process's own feeds
// through l, and NATS only when others may listen (Local). Call it
// before the first batch.
func (p *Publisher) UseLocal(l *Local) {
	l.addWorker(p.instance)
	p.local = l
}

func (p *Publisher) publish(batch []kv.Event) {
	if p.local != nil {
		p.local.deliver(p.model, p.instance, batch)
		if !p.local.alsoNATS {
			p.batches.Add(1)
			p.events.Add(int64(len(batch)))
			return
		}
	}
	b, err := protoMarshalBatch(p.instance, batch)
	if err == nil && p.nc != nil {
		err = p.nc.Publish(p.subject, b)
	}
	if err != nil {
		if p.failures.Add(1)%1000 == 1 {
			p.logger.Warn("event publish failed; routers will repair the gap", "subject", p.subject, "err", err)
		}
		return
	}
	p.batches.Add(1)
	p.events.Add(int64(len(batch)))
}

// Subject is where the events go.
func (p *Publisher) Subject() string { return p.subject }

// Counts returns published batches, events and failed publishes.
func (p *Publisher) Counts() (batches, events, failures int64) {
	return p.batches.Load(), p.events.Load(), p.failures.Load()
}

// EventsAnswer answers an api Events request from the log.
func (l *EventLog) EventsAnswer(req *api.EventsRequest) *api.EventsResponse {
	evs, res := l.Range(api.KeyFromProto(req.Worker), req.FromId, req.ToId, maxEventsPerAnswer)
	return &api.EventsResponse{Events: api.EventsToProto(evs), TooOld: res.TooOld, TooNew: res.TooNew, LastId: res.Last}
}

// DumpAnswer answers an api Dump request from the log.
func (l *EventLog) DumpAnswer(req *api.DumpRequest) *api.DumpResponse {
	evs, last, ok := l.Dump(api.KeyFromProto(req.Worker))
	return &api.DumpResponse{Events: api.EventsToProto(evs), LastId: last, NoInventory: !ok}
}

func protoMarshalBatch(instance uint64, evs []kv.Event) ([]byte, error) {
	return proto.Marshal(&api.KvEventBatch{Instance: instance, Events: api.EventsToProto(evs)})
}
