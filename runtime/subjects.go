package runtime

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/zeebo/xxh3"
)

// Subject layout. Model names may hold characters NATS subjects and KV keys
// reject ('.', '*', '>', spaces, ':'), so they travel as ModelToken.
const (
	subjectPrefix = "kvmesh"
	// DefaultBucket is the discovery KV bucket.
	DefaultBucket = "kvmesh_instances"
)

// ModelToken is a subject- and KV-key-safe form of a model name: the name
// with unsafe bytes replaced by '_', plus a short hash when anything was
// replaced, so distinct names never collide.
func ModelToken(model string) string {
	var b strings.Builder
	changed := false
	for i := 0; i < len(model); i++ {
		c := model[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			b.WriteByte(c)
		} else {
			b.WriteByte('_')
			changed = true
		}
	}
	if model == "" {
		return "_"
	}
	if changed {
		fmt.Fprintf(&b, "-%08x", uint32(xxh3.HashString(model)))
	}
	return b.String()
}

// InstanceToken is the hex form of an instance id used in subjects and keys.
func InstanceToken(id uint64) string { return strconv.FormatUint(id, 16) }

// EventSubject is where an instance publishes its KV event batches.
func EventSubject(model string, instance uint64) string {
	return subjectPrefix + ".events." + ModelToken(model) + "." + InstanceToken(instance)
}

// EventSubjectAll matches every instance's events for one model.
func EventSubjectAll(model string) string {
	return subjectPrefix + ".events." + ModelToken(model) + ".*"
}

// LoadSubject is where an instance publishes its load reports.
func LoadSubject(model string, instance uint64) string {
	return subjectPrefix + ".load." + ModelToken(model) + "." + InstanceToken(instance)
}

// LoadSubjectAll matches every instance's load reports for one model.
func LoadSubjectAll(model string) string {
	return subjectPrefix + ".load." + ModelToken(model) + ".*"
}

// SyncSubject is the replica-sync subject of one model and topic.
func SyncSubject(model, topic string) string {
	return subjectPrefix + ".sync." + ModelToken(model) + "." + ModelToken(topic)
}

// parseInstanceToken reads the last subject token as an instance id.
func parseInstanceToken(subject string) (uint64, error) {
	i := strings.LastIndexByte(subject, '.')
	id, err := strconv.ParseUint(subject[i+1:], 16, 64)
	if err != nil {
		return 0, fmt.Errorf("subject %q: bad instance token: %w", subject, err)
	}
	return id, nil
}
