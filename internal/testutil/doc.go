// Package testutil owns what kvmesh's tests share: reading Prometheus
// metrics from a registry or a /metrics endpoint, polling for a condition
// with a deadline, and running real kvmesh processes (the binary built
// once per test binary), and benchmarking a fetch against raw loopback
// TCP. Only _test.go files import it; it imports no kvmesh package outside
// internal/, so every package's tests can use it.
package testutil
