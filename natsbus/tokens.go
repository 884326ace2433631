package natsbus

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/zeebo/xxh3"
)

// SubjectPrefix starts every kvmesh subject.
const SubjectPrefix = "kvmesh"

// ModelToken is a subject- and KV-key-safe form of a model name: the name
// with unsafe bytes replaced by '_', plus a short hash when anything was
// replaced, so distinct names never collide. Model names may hold
// characters NATS subjects and KV keys reject ('.', '*', '>', spaces, ':').
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

// ParseInstanceToken reads the last token of a subject or key as an
// instance id.
func ParseInstanceToken(subject string) (uint64, error) {
	i := strings.LastIndexByte(subject, '.')
	id, err := strconv.ParseUint(subject[i+1:], 16, 64)
	if err != nil {
		return 0, fmt.Errorf("subject %q: bad instance token: %w", subject, err)
	}
	return id, nil
}

// SyncSubject is the replica-sync subject of one model and topic.
func SyncSubject(model, topic string) string {
	return SubjectPrefix + ".sync." + ModelToken(model) + "." + ModelToken(topic)
}
