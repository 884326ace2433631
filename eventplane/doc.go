// Package eventplane owns the KV event plane on NATS: the subjects, the
// worker side (EventLog, the per-key ring of stamped events that answers
// range and dump requests; Publisher, which puts each batch on the
// instance's subject), load reports (which also announce each key's last
// event id), and the router side (Feed), which applies every worker key's
// events to the index in id order and repairs gaps.
//
// The feed's ordering and gap logic is FeedCore, a caller-driven state
// machine with no goroutines, no NATS and no clock; Feed is the thin loop
// that drives it from subscriptions and repair answers.
//
// It makes no routing decisions and must not import router, index,
// workerclient or frontend: the index comes in as an Applier and the worker
// API as a Repairer.
package eventplane
