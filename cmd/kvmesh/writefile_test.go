package main

import (
	"os"
	"path/filepath"
	"testing"
)

// The file appears whole with the asked mode, replaces an older one, and
// leaves no temporary file behind.
func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "llm_api_options.yaml")
	if err := os.WriteFile(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := writeFileAtomic(p, []byte("connector_module: x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil || string(b) != "connector_module: x\n" {
		t.Fatalf("read back %q, %v", b, err)
	}
	if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v, %v; want 0644", st.Mode().Perm(), err)
	}
	if es, _ := os.ReadDir(dir); len(es) != 1 {
		t.Fatalf("directory holds %d entries, want the file alone", len(es))
	}
	if err := writeFileAtomic(filepath.Join(dir, "missing", "f"), nil, 0o644); err == nil {
		t.Fatal("a file in a missing directory was written")
	}
}
