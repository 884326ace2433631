package main

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"
)

// docs/hints.md stays true: its envelope validates, and each failing
// example prints the error the doc shows.
func TestHintsDocExamples(t *testing.T) {
	doc, err := os.ReadFile("../../docs/hints.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```json\n(.*?)```").FindAllSubmatch(doc, -1)
	if len(blocks) == 0 {
		t.Fatal("no json example")
	}
	for _, b := range blocks {
		var out bytes.Buffer
		if err := validateHint(bytes.NewReader(b[1]), "-", "", &out); err != nil {
			t.Errorf("example envelope: %v\n%s", err, b[1])
		}
	}
	bad := regexp.MustCompile(`(?m)^\$ echo '(.*)' \| kvmesh hints validate\n(kvmesh: .*)$`).FindAllSubmatch(doc, -1)
	if len(bad) < 2 {
		t.Fatalf("%d failing examples, want 2", len(bad))
	}
	for _, m := range bad {
		err := validateHint(bytes.NewReader(m[1]), "-", "", &bytes.Buffer{})
		if err == nil || "kvmesh: "+err.Error() != string(m[2]) {
			t.Errorf("%s: got %v, doc says %q", m[1], err, strings.TrimPrefix(string(m[2]), "kvmesh: "))
		}
	}
}
