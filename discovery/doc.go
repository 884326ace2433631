// Package discovery owns who is out there: the Instance record a worker
// registers (JSON in a JetStream KV bucket with a TTL), Registration, which
// keeps a record alive, and Watcher, which follows one model's instances
// and reports each add, update and removal.
//
// It says nothing about what instances hold or how loaded they are: it
// must not import eventplane, workerclient, router or index; it builds on
// natsbus and kv only.
package discovery
