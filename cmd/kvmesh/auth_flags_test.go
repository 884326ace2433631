package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAPIKeyFlags(t *testing.T) {
	t.Setenv(apiKeysEnv, "")
	dir := t.TempDir()
	file := filepath.Join(dir, "keys")
	if err := os.WriteFile(file, []byte("# keys\nsk-a\nsk-b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	af := authFlags{apiKeyFile: file}
	k, err := af.apiKeys()
	if err != nil || k.Len() != 2 {
		t.Fatalf("%v %v", k, err)
	}
	t.Setenv(apiKeysEnv, "sk-c,sk-d")
	if k, err = af.apiKeys(); err != nil || k.Len() != 4 {
		t.Fatalf("file and env: %v %v", k, err)
	}
	if k, err = (&authFlags{}).apiKeys(); err != nil || k.Len() != 2 {
		t.Fatalf("env only: %v %v", k, err)
	}
	t.Setenv(apiKeysEnv, "")
	if k, err = (&authFlags{}).apiKeys(); err != nil || k != nil {
		t.Fatalf("none configured: %v %v", k, err)
	}
	for _, bad := range []string{filepath.Join(dir, "missing"), filepath.Join(dir, "empty")} {
		os.WriteFile(filepath.Join(dir, "empty"), []byte("# nothing\n"), 0o600)
		if _, err := (&authFlags{apiKeyFile: bad}).apiKeys(); err == nil || !strings.Contains(err.Error(), "--api-key-file") {
			t.Errorf("%s: %v, want an error naming --api-key-file", bad, err)
		}
	}
	for addr, want := range map[string]bool{"127.0.0.1:8000": true, "[::1]:80": true, "localhost:1": true,
		":8000": false, "0.0.0.0:8000": false, "10.0.0.5:8000": false, "bad": false} {
		if got := isLoopbackListen(addr); got != want {
			t.Errorf("isLoopbackListen(%q) = %v", addr, got)
		}
	}
}
