package main

import (
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/frontend"
)

func TestLoadModelTokenizerFlag(t *testing.T) {
	m, err := loadModel("tiny", "../../tokenizer/testdata/tiny")
	if err != nil {
		t.Fatal(err)
	}
	builtin, _ := frontend.BuiltinModel("tiny")
	msgs := []frontend.Message{{Role: "user", Content: "hello world"}}
	a, err := m.EncodeChat(msgs)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := builtin.EncodeChat(msgs)
	if len(a) == 0 || len(m.EOS) == 0 || m.VocabSize == builtin.VocabSize || (len(a) == len(b) && a[0] == b[0]) {
		t.Fatalf("the HF tokenizer was not used: %v vs %v (eos %v, vocab %d)", a, b, m.EOS, m.VocabSize)
	}
	if _, err := loadModel("x", t.TempDir()); err == nil || !strings.Contains(err.Error(), "--tokenizer") {
		t.Fatalf("missing files: %v", err)
	}
}
