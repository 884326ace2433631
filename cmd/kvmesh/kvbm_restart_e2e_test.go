package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/fleet"
	"github.com/kvmesh/kvmesh/frontend"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvbm"
	"github.com/kvmesh/kvmesh/natsbus"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestWorkerKVBMRestartRecoversDisk: a worker with a disk tier serves a
// long prompt, is killed (SIGKILL), one of its disk blocks is corrupted,
// and it restarts with the same instance id and disk directory. It
// recovers the intact blocks (the corrupt one dropped and counted) and
// announces them: with a fresh second worker beside it, the router sends
// the repeat to it for its disk holdings, which serve the prefix up to the
// corrupt block, and the answer is unchanged.
func TestWorkerKVBMRestartRecoversDisk(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvmesh processes")
	}
	ns, err := natsbus.StartEmbedded(natsbus.EmbeddedConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	dir := t.TempDir()
	const instance = "7e57"
	metricsAddr := freeAddr(t)
	args := []string{"worker", "--nats", ns.URL(), "--speedup-ratio", "0", "--log-level", "warn",
		"--discovery-ttl", "1s", "--load-interval", "200ms", "--instance-id", instance, "--blocks", "256",
		"--connector", "kvbm", "--kvbm-disk-blocks", "512", "--kvbm-disk-dir", dir, "--metrics-listen", metricsAddr}
	a := startProc(t, "kvmesh worker A", args...)
	a.Expect(workerLine, 20*time.Second)
	const adminKey = "kvbm-admin-key-0123456789"
	adminKeys := filepath.Join(dir, "admin-keys")
	if err := os.WriteFile(adminKeys, []byte(adminKey), 0o600); err != nil {
		t.Fatal(err)
	}
	fe := startProc(t, "kvmesh frontend", "frontend", "--nats", ns.URL(), "--listen", "127.0.0.1:0", "--log-level", "warn", "--admin-key-file", adminKeys)
	base := fe.Expect(frontendLine, 20*time.Second)[1]
	testutil.WaitFor(t, 10*time.Second, "frontend /health", func() bool {
		resp, err := http.Get(strings.TrimSuffix(base, "/v1") + "/health")
		if err != nil {
			return false
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	client := newClient(base)
	content := longPrompt(0)
	plen := len(chatPromptTokens(t, simModel, frontend.Message{Role: "user", Content: content}))
	r0 := chatOnce(t, client, chatParams(content, 9, 8))
	scrape := func(name string) float64 {
		for k, v := range testutil.Scrape(t, "http://"+metricsAddr+"/metrics") {
			if strings.HasPrefix(k, name+"{") {
				return v
			}
		}
		return -1
	}
	full := plen / 64
	// The kill must find every prompt block written to disk, not only
	// those offloaded before the answer came back.
	testutil.WaitFor(t, 10*time.Second, "the prompt's blocks on disk", func() bool {
		return scrape("kvmesh_kvbm_offloaded_disk_blocks_total") >= float64(full)
	}, func() string { return fmt.Sprintf("%v of %d", scrape("kvmesh_kvbm_offloaded_disk_blocks_total"), full) })

	a.Kill()
	// Corrupt block 40 of the prompt: bypass-host offload wrote its blocks
	// in order from slot 0.
	files, _ := filepath.Glob(filepath.Join(dir, "*.g3"))
	if len(files) != 1 {
		t.Fatalf("disk tier files %v", files)
	}
	df, err := kvbm.OpenDiskFile(files[0], 512, 2*64)
	if err != nil || !df.Reopened {
		t.Fatalf("reopen %s: %v (reopened %v)", files[0], err, df != nil && df.Reopened)
	}
	off := df.PayloadOffset(40)
	df.Close()
	f, err := os.OpenFile(files[0], os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("corrupt"), off+10); err != nil {
		t.Fatal(err)
	}
	f.Close()

	// Let the dead worker's record expire, then restart it beside a fresh
	// worker without a connector.
	ws := watchWorkers(t, ns.URL(), simModel, 0)
	testutil.WaitFor(t, 15*time.Second, "the killed worker leaves discovery", func() bool {
		return len(ws.watcher.Instances()) == 0
	})
	a2 := startProc(t, "kvmesh worker A restarted", args...)
	a2.Expect(workerLine, 20*time.Second)
	b := startProc(t, "kvmesh worker B", "worker", "--nats", ns.URL(), "--speedup-ratio", "0", "--log-level", "warn", "--blocks", "256")
	b.Expect(workerLine, 20*time.Second)
	testutil.WaitFor(t, 15*time.Second, "both workers in discovery", func() bool {
		return len(ws.watcher.Instances()) == 2
	})
	if rec, bad := scrape("kvmesh_kvbm_recovered_disk_blocks_total"), scrape("kvmesh_kvbm_corrupt_blocks_total"); rec != float64(full-1) || bad != 1 {
		t.Fatalf("recovered %v blocks and dropped %v corrupt; want %d and 1", rec, bad, full-1)
	}
	// The router routes by the recovered blocks once the restarted
	// worker's holdings reach its index: the 40 up to the corrupt block
	// (not the killed process's, which held the whole prompt).
	diskHeld := func() int {
		req, err := http.NewRequest("GET", strings.TrimSuffix(base, "/v1")+"/debug/kv-index", nil)
		if err != nil {
			return -1
		}
		req.Header.Set("Authorization", "Bearer "+adminKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return -1
		}
		defer resp.Body.Close()
		var v fleet.IndexView
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			return -1
		}
		for _, w := range v.Workers {
			if w.Instance == instance {
				return len(w.Blocks["disk"])
			}
		}
		return 0
	}
	testutil.WaitFor(t, 10*time.Second, "the router's index holds the recovered disk blocks", func() bool { return diskHeld() == 40 },
		func() string { return fmt.Sprintf("%d disk blocks, want 40", diskHeld()) })
	r1 := chatOnce(t, client, chatParams(content, 9, 8))
	if r1.Choices[0].Message.Content != r0.Choices[0].Message.Content {
		t.Fatalf("after the restart the answer is %q, before %q", r1.Choices[0].Message.Content, r0.Choices[0].Message.Content)
	}
	if got := int(r1.Usage.PromptTokensDetails.CachedTokens); got != 40*64 {
		t.Fatalf("repeat: %d cached tokens, want the %d before the corrupt block (routed to the recovered worker)", got, 40*64)
	}
	if v := scrape("kvmesh_kvbm_onboarded_disk_blocks_total"); v != 40 {
		t.Fatalf("onboarded %v disk blocks, want 40", v)
	}
	a2.Stop(os.Interrupt, 10*time.Second)
	b.Stop(os.Interrupt, 10*time.Second)
	fe.Stop(os.Interrupt, 10*time.Second)
}
