// Package proctest starts real kvmesh processes for end-to-end tests: it
// builds the binary once per test into a temp dir, starts subcommands,
// reads their stdout line by line, and kills whatever is left at cleanup.
package proctest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Build compiles the module's ./cmd/kvmesh into t.TempDir() and returns the
// binary's path.
func Build(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	mod := strings.TrimSpace(string(out))
	if err != nil || mod == "" || mod == os.DevNull {
		t.Fatalf("proctest: cannot find the module root: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "kvmesh")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/kvmesh")
	cmd.Dir = filepath.Dir(mod)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("proctest: go build ./cmd/kvmesh: %v\n%s", err, b)
	}
	return bin
}

// Proc is one running process.
type Proc struct {
	t     testing.TB
	cmd   *exec.Cmd
	lines chan string
	done  chan struct{}

	mu     sync.Mutex
	stderr bytes.Buffer
	err    error
}

// Start runs bin with args and extra environment (KEY=VALUE), and kills it
// at cleanup if it is still running.
func Start(t testing.TB, bin string, env []string, args ...string) *Proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	p := &Proc{t: t, cmd: cmd, lines: make(chan string, 1024), done: make(chan struct{})}
	cmd.Stderr = &lockedWriter{p: p}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("proctest: start %s %v: %v", bin, args, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			default: // nobody reads: drop
			}
		}
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("stderr of %v:\n%s", args, p.Stderr())
		}
	})
	return p
}

type lockedWriter struct{ p *Proc }

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	return w.p.stderr.Write(b)
}

// Stderr is everything the process wrote to stderr so far.
func (p *Proc) Stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// WaitLine returns the first stdout line starting with prefix.
func (p *Proc) WaitLine(prefix string, timeout time.Duration) (string, error) {
	deadline := time.After(timeout)
	for {
		select {
		case l := <-p.lines:
			if strings.HasPrefix(l, prefix) {
				return l, nil
			}
		case <-p.done:
			return "", fmt.Errorf("process exited (%v) before printing %q; stderr:\n%s", p.Err(), prefix, p.Stderr())
		case <-deadline:
			return "", fmt.Errorf("no %q line within %v; stderr:\n%s", prefix, timeout, p.Stderr())
		}
	}
}

// Fields parses "k=v" words of a line.
func Fields(line string) map[string]string {
	m := map[string]string{}
	for _, w := range strings.Fields(line) {
		if k, v, ok := strings.Cut(w, "="); ok {
			m[k] = v
		}
	}
	return m
}

// Stop sends SIGTERM and waits up to timeout for a clean exit, then kills.
// It returns the exit error (nil for a clean exit).
func (p *Proc) Stop(timeout time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.Err()
	case <-time.After(timeout):
		p.Kill()
		return fmt.Errorf("did not exit within %v after SIGTERM", timeout)
	}
}

// Kill kills the process (a crash: no deregistration) and waits for it.
func (p *Proc) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Signal sends sig to the process, e.g. SIGSTOP to freeze it without
// closing its sockets (a hung worker); Kill still ends a stopped process.
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Err is the exit error once the process has exited.
func (p *Proc) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }
