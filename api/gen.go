// Package api holds the kvmesh worker API (worker.proto) and its generated
// gRPC code, plus conversions between the protobuf forms and package kv.
//
// It imports only kv (and the OpenTelemetry API, for W3C trace context in
// metadata: trace.go): every kvmesh process speaks it, so it must not import
// the rooms that use it.
package api

//go:generate protoc --proto_path=. --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative worker.proto
