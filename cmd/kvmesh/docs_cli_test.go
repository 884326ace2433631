package main

import (
	"os"
	"strings"
	"testing"
)

// docs/cli.md is what `go generate ./cmd/kvmesh` writes today: a flag
// added, renamed or re-defaulted without regenerating fails here.
func TestCLIDocCurrent(t *testing.T) {
	var b strings.Builder
	if err := writeCLIDoc(&b, rootCmd); err != nil {
		t.Fatal(err)
	}
	have, err := os.ReadFile(cliDocPath)
	if err != nil {
		t.Fatalf("%v: run go generate ./cmd/kvmesh", err)
	}
	if string(have) != b.String() {
		t.Fatalf("%s is stale: run go generate ./cmd/kvmesh (kvmesh docs cli --out docs/cli.md)", cliDocPath)
	}
	// The reference covers the commands people run, each flag with its
	// environment variable.
	for _, want := range []string{"## kvmesh serve", "## kvmesh frontend", "## kvmesh worker", "## kvmesh twin", "## kvmesh bench load", "## kvmesh mock-engine vllm",
		"| `--engine-url` | `KVMESH_ENGINE_URL` |", "| `--blocks` | `KVMESH_TWIN_BLOCKS` |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("docs/cli.md lacks %q", want)
		}
	}
}
