package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
)

// testAdminKey is the admin key e2e tests give serve and frontend so they
// can read /debug/* (off without --admin-key-file).
const testAdminKey = "e2e-admin-key-0123456789"

// adminKeyArgs writes testAdminKey to a file and returns the flag naming it.
func adminKeyArgs(t *testing.T) []string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "admin-keys")
	if err := os.WriteFile(f, []byte(testAdminKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return []string{"--admin-key-file", f}
}

// getAdminJSON decodes GET url, sent with the admin key, into v; any
// status but 200 fails the test.
func getAdminJSON(t *testing.T, url string, v any) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testAdminKey)
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	body, _ := io.ReadAll(r.Body)
	if r.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, r.StatusCode, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GET %s: %v: %s", url, err, body)
	}
}
