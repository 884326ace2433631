// Package testutil owns what kvmesh's tests share: reading Prometheus
// metrics from a registry or a /metrics endpoint, polling for a condition
// with a deadline, and running real kvmesh processes (the binary built
// once per test binary). Only _test.go files import it; it imports no
// kvmesh package, so every package's tests can use it.
package testutil
