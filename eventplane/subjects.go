package eventplane

import "github.com/kvmesh/kvmesh/natsbus"

// EventSubject is where an instance publishes its KV event batches.
func EventSubject(model string, instance uint64) string {
	return natsbus.SubjectPrefix + ".events." + natsbus.ModelToken(model) + "." + natsbus.InstanceToken(instance)
}

// EventSubjectAll matches every instance's events for one model.
func EventSubjectAll(model string) string {
	return natsbus.SubjectPrefix + ".events." + natsbus.ModelToken(model) + ".*"
}

// LoadSubject is where an instance publishes its load reports.
func LoadSubject(model string, instance uint64) string {
	return natsbus.SubjectPrefix + ".load." + natsbus.ModelToken(model) + "." + natsbus.InstanceToken(instance)
}

// LoadSubjectAll matches every instance's load reports for one model.
func LoadSubjectAll(model string) string {
	return natsbus.SubjectPrefix + ".load." + natsbus.ModelToken(model) + ".*"
}
