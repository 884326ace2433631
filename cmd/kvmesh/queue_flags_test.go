package main

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestQueueFlags(t *testing.T) {
	parse := func(args ...string) (*queueFlags, error) {
		var q queueFlags
		f := pflag.NewFlagSet("t", pflag.ContinueOnError)
		addQueueFlags(f, &q, "off")
		return &q, f.Parse(args)
	}
	q, _ := parse()
	if qc, ac, err := q.config(); qc != nil || ac != nil || err != nil {
		t.Fatalf("default: %v %v %v, want off", qc, ac, err)
	}
	q, _ = parse("--router-queue", "on", "--router-queue-policy", "wspt", "--router-queue-limit", "7", "--admit-waiting", "-1", "--admit-wait-weight", "-1")
	qc, ac, err := q.config()
	if err != nil || qc.Policy != "wspt" || qc.Limit != 7 || ac.Waiting != -1 || ac.KVUsage != 0.97 || ac.WaitWeight != -1 {
		t.Fatalf("on: %+v %+v %v", qc, ac, err)
	}
	for _, bad := range [][]string{
		{"--router-queue", "maybe"},
		{"--router-queue", "on", "--router-queue-policy", "lifo"},
		{"--router-queue", "on", "--router-queue-limit", "-1"},
		{"--router-queue", "on", "--router-queue-max-wait", "0s"},
		{"--router-queue", "on", "--router-queue-lookahead", "0"},
		{"--router-queue", "on", "--admit-kv-usage", "1.5"},
		{"--router-queue", "on", "--admit-prefill-passes", "0"},
		{"--router-queue", "on", "--admit-waiting", "NaN"},
		{"--router-queue", "on", "--admit-wait-weight", "0"},
	} {
		q, err := parse(bad...)
		if err == nil {
			_, _, err = q.config()
		}
		if err == nil || !strings.Contains(err.Error(), bad[len(bad)-2]) {
			t.Errorf("%v: %v, want an error naming %s", bad, err, bad[len(bad)-2])
		}
	}
}
