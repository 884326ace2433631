// Package chaos owns kvmesh's chaos suite (`go test ./chaos -run Chaos`):
// it runs a fleet of real kvmesh processes (the built binary: frontend
// replicas and workers) over a NATS server it restarts at will, drives them
// with `bench load`'s client at a fixed rate, and injects faults one at a
// time and then together — SIGKILL and SIGSTOP of workers, a NATS restart,
// dropped and duplicated event batches, peers that corrupt or stall
// transfers, a frontend replica killed — through real mechanisms (signals,
// restarts, a NATS-protocol proxy, a TCP proxy in front of the peers'
// control endpoints). For each fault it accounts every request (sent,
// completed, migrated, failed, lost) and compares the routers' KV index
// (the frontend's /debug/kv-index) with every worker's own inventory.
//
// The short variant runs in the default test run; the long runs need
// KVMESH_CHAOS=1. docs/reliability.md holds their figures.
//
// The suite lives in _test.go files. Nothing may import this package; it
// talks to the processes only over their public surfaces (HTTP, gRPC, NATS)
// and imports kvmesh packages only for their wire types and clients.
package chaos
