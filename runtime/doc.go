// Package runtime is kvmesh's cluster plumbing on NATS: an embedded or
// external NATS connection, worker discovery in a JetStream KV bucket with
// TTL, the KV event plane (worker-side EventLog, router-side EventFeed with
// gap repair over the worker gRPC API), load reports and a generic broadcast
// for router replica sync.
//
// Nothing here makes routing decisions: the router and index stay pure and
// are fed by these pieces.
package runtime
