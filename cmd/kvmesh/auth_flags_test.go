package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

func TestAPIKeyFlags(t *testing.T) {
	t.Setenv(apiKeysEnv, "")
	dir := t.TempDir()
	file := filepath.Join(dir, "keys")
	if err := os.WriteFile(file, []byte("# keys\nsk-a-0123456789abcdef\nsk-b-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	af := authFlags{apiKeyFile: file}
	k, err := af.apiKeys()
	if err != nil || k.Len() != 2 {
		t.Fatalf("%v %v", k, err)
	}
	t.Setenv(apiKeysEnv, "sk-c-0123456789abcdef,sk-d-0123456789abcdef")
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
	// A short key stops the command with one line naming where it came from.
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body), 0o600)
		return p
	}
	if _, err := (&authFlags{apiKeyFile: write("short", "sk-0123456789abcdef\nsk-1\n")}).apiKeys(); err == nil ||
		!strings.Contains(err.Error(), "--api-key-file") || !strings.Contains(err.Error(), "4 characters, want at least 16") || strings.Contains(err.Error(), "\n") {
		t.Errorf("a short key in the file: %v", err)
	}
	t.Setenv(apiKeysEnv, "sk-2")
	if _, err := (&authFlags{}).apiKeys(); err == nil || !strings.HasPrefix(err.Error(), apiKeysEnv+":") {
		t.Errorf("a short key in %s: %v", apiKeysEnv, err)
	}
	t.Setenv(apiKeysEnv, "")
	if k, err := (&authFlags{adminKeyFile: write("admin", "admin-0123456789abcdef\n")}).adminKeys(); err != nil || k.Len() != 1 {
		t.Errorf("admin keys: %v %v", k, err)
	}
	if _, err := (&authFlags{adminKeyFile: write("admin-short", "admin\n")}).adminKeys(); err == nil || !strings.Contains(err.Error(), "--admin-key-file") {
		t.Errorf("a short admin key: %v", err)
	}
	if k, err := (&authFlags{}).adminKeys(); k != nil || err != nil {
		t.Errorf("no admin keys: %v %v", k, err)
	}
	for addr, want := range map[string]bool{"127.0.0.1:8000": true, "[::1]:80": true, "localhost:1": true,
		":8000": false, "0.0.0.0:8000": false, "10.0.0.5:8000": false, "bad": false} {
		if got := isLoopbackListen(addr); got != want {
			t.Errorf("isLoopbackListen(%q) = %v", addr, got)
		}
	}
}

func TestFleetTokenFlag(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if tok, err := (&fleetFlags{}).token(); tok != "" || err != nil {
		t.Fatalf("none: %q %v", tok, err)
	}
	if tok, err := (&fleetFlags{tokenFile: write("good", "  0123456789abcdef-xyz\n")}).token(); tok != "0123456789abcdef-xyz" || err != nil {
		t.Fatalf("good: %q %v", tok, err)
	}
	for _, bad := range []string{write("short", "abc\n"), write("space", "0123456789 abcdef\n"), filepath.Join(dir, "missing")} {
		if _, err := (&fleetFlags{tokenFile: bad}).token(); err == nil || !strings.Contains(err.Error(), "--fleet-token-file") {
			t.Errorf("%s: %v, want an error naming --fleet-token-file", bad, err)
		}
	}
}

func TestTLSFlags(t *testing.T) {
	pki := testutil.NewFleetPKI(t, "fleet")
	srv, cl, err := (&tlsFlags{cert: pki.CertFile, key: pki.KeyFile, ca: pki.CAFile}).configs()
	if err != nil || srv == nil || cl == nil || len(srv.Certificates) != 1 || srv.ClientCAs == nil || cl.RootCAs == nil {
		t.Fatalf("%v %v %v", srv, cl, err)
	}
	if srv, cl, err := (&tlsFlags{}).configs(); srv != nil || cl != nil || err != nil {
		t.Fatalf("none: %v %v %v", srv, cl, err)
	}
	for _, c := range []struct {
		f    tlsFlags
		flag string
	}{
		{tlsFlags{cert: pki.CertFile, key: pki.KeyFile}, "--tls-ca"},
		{tlsFlags{cert: pki.CertFile, ca: pki.CAFile}, "--tls-key"},
		{tlsFlags{cert: pki.CAFile + ".missing", key: pki.KeyFile, ca: pki.CAFile}, "--tls-cert"},
		{tlsFlags{cert: pki.CertFile, key: pki.KeyFile, ca: pki.KeyFile}, "--tls-ca"},
	} {
		if _, _, err := c.f.configs(); err == nil || !strings.Contains(err.Error(), c.flag) {
			t.Errorf("%+v: %v, want an error naming %s", c.f, err, c.flag)
		}
	}
}

// The API beyond loopback without API keys warns, a fleet token or TLS
// notwithstanding: they guard the workers, not the API.
func TestWarnOpenListen(t *testing.T) {
	t.Setenv(apiKeysEnv, "")
	for _, c := range []struct {
		ff   frontendFlags
		warn string
	}{
		{frontendFlags{listen: "127.0.0.1:8000"}, ""},
		{frontendFlags{listen: ":8000"}, "anyone who can reach it"},
		{frontendFlags{listen: ":8000", fleet: fleetFlags{tokenFile: "tok"}}, "the fleet token and TLS guard the workers, not the API"},
		{frontendFlags{listen: ":8000", tls: tlsFlags{cert: "c"}}, "not the API"},
		{frontendFlags{listen: ":8000", fleet: fleetFlags{tokenFile: "tok"}, auth: authFlags{apiKeyFile: "keys"}}, ""},
	} {
		var buf strings.Builder
		warnOpenListen(slog.New(slog.NewTextHandler(&buf, nil)), &c.ff)
		if got := buf.String(); (c.warn == "") != (got == "") || !strings.Contains(got, c.warn) {
			t.Errorf("%+v: logged %q, want %q", c.ff, got, c.warn)
		}
	}
}

// Unauthenticated NATS is warned about exactly when it reaches beyond
// loopback (probe 9 of issue 23, its NATS half).
func TestWarnInsecureNATS(t *testing.T) {
	for _, c := range []struct {
		insecure bool
		listen   string
		warn     bool
	}{
		{true, "0.0.0.0:4222", true},
		{true, "10.1.2.3:4222", true},
		{true, "[::]:4222", true},
		{true, "127.0.0.1:4222", false},
		{true, "localhost:0", false},
		{false, "0.0.0.0:4222", false},
	} {
		var buf strings.Builder
		warnInsecureNATS(slog.New(slog.NewTextHandler(&buf, nil)), c.insecure, c.listen)
		if got := strings.Contains(buf.String(), "--insecure-nats"); got != c.warn {
			t.Errorf("insecure %v listen %s: warned %v, want %v (%q)", c.insecure, c.listen, got, c.warn, buf.String())
		}
	}
}
