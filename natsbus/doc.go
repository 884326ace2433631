// Package natsbus owns kvmesh's NATS plumbing: the embedded server
// (StartEmbedded), client connections that reconnect forever (Connect), the
// subject and key tokens every NATS name is built from (ModelToken,
// InstanceToken), and Broadcast, the best-effort fan-out router replicas
// use to share state.
//
// It knows nothing of what travels on it: it must not import discovery,
// eventplane, workerclient or any kvmesh room above kv.
package natsbus
