// Package router picks the worker for each request: it hashes the prompt's
// full blocks, asks an index which workers hold how much of that prefix on
// which tier, adds its own estimate of each worker's load, and minimises
// the cost model of DESIGN.md §5. It tracks the load its decisions create
// (prefill tokens until the first token, unique active blocks until the
// request ends), shares that load with other router replicas through
// compact messages, rejects with kv.ErrAllBusy when every worker is past its
// busy thresholds, keeps a worker that failed a request out of selection
// until a deadline (Inhibit, Decision.Fail; a request may also exclude
// workers of its own), and plans KV hints (a peer holding a longer prefix).
//
// Selection runs in stages, a mode being a profile of them (stages.go):
// filters that say why they drop a worker (filter.go), a scorer
// (score.go) and a picker (pick.go). The leg planner (plan.go) is the
// disaggregated-serving rules as a state machine that the fleet and the
// twin drive alike.
//
// The router is a pure core: it does no network I/O. Discovery updates
// (AddWorker/RemoveWorker), worker load reports (UpdateLoad) and replica
// messages (ApplyReplicaEvent) are fed to it by the caller; KV events go to
// the index the caller hands it. Time comes from an injectable clock so the
// twin can run it on virtual time.
//
// It must not import the fleet, the transports (NATS, gRPC, api) or the
// HTTP frontend: those drive it.
package router
