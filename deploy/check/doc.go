// Package check validates the Helm chart in deploy/helm/kvmesh offline: it
// renders the chart with a real helm binary, decodes every manifest strictly
// into the k8s.io/api types (unknown fields are errors), checks what a
// reviewer would (probes, resource requests, non-root, pinned images, no
// secret material inline, flags the kvmesh binary really has), and runs the
// rendered command lines against a real NATS server on loopback.
//
// It is its own Go module so that k8s.io/api never enters the kvmesh
// binary's dependencies; it imports nothing from kvmesh and builds the
// binary it runs with `go build`. `go test ./...` at the repository root
// does not descend into it: run `cd deploy/check && go test ./...`.
package check
