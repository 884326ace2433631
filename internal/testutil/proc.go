package testutil

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The kvmesh binary, built at most once per test binary.
var (
	binOnce    sync.Once
	binDir     string
	binPath    string
	binErr     error
	binRemoved atomic.Bool // set by WithBinary: someone removes binDir
)

// Runner runs a package's tests and then removes the binary Binary built.
type Runner struct{ m *testing.M }

// WithBinary wraps the m of a TestMain whose tests call Binary, so the
// built binary is removed when the tests end: os.Exit(WithBinary(m).Run())
// or goleak.VerifyTestMain(WithBinary(m)).
func WithBinary(m *testing.M) *Runner {
	binRemoved.Store(true)
	return &Runner{m: m}
}

// Run runs the tests, removes the binary and returns the exit code.
func (r *Runner) Run() int {
	code := r.m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	return code
}

// Binary returns the path of the kvmesh binary: $KVMESH_TEST_BIN if set (a
// prebuilt binary, handy while iterating on the tests alone), else the
// module's ./cmd/kvmesh built once per test binary. The package's TestMain
// must run its tests through WithBinary.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("KVMESH_TEST_BIN"); p != "" {
		return p
	}
	if !binRemoved.Load() {
		t.Fatal("testutil.Binary: the package's TestMain must run the tests through testutil.WithBinary")
	}
	binOnce.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		mod := strings.TrimSpace(string(out))
		if err != nil || mod == "" || mod == os.DevNull {
			binErr = fmt.Errorf("cannot find the module root: %v", err)
			return
		}
		if binDir, binErr = os.MkdirTemp("", "kvmesh-test-"); binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "kvmesh")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/kvmesh")
		cmd.Dir = filepath.Dir(mod)
		if b, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./cmd/kvmesh: %v\n%s", err, b)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// Proc is one running process whose stdout lines are read as they come.
type Proc struct {
	t     testing.TB
	name  string
	cmd   *exec.Cmd
	lines chan string
	done  chan struct{}

	mu     sync.Mutex
	stderr bytes.Buffer
	err    error
}

// Start runs bin with args and extra environment (KEY=VALUE). name labels
// it in failure messages. At the test's end the process is killed if it
// still runs, and its stderr logged if the test failed.
func Start(t testing.TB, name, bin string, env []string, args ...string) *Proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	p := &Proc{t: t, name: name, cmd: cmd, lines: make(chan string, 1024), done: make(chan struct{})}
	cmd.Stderr = stderrWriter{p}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s (%s %v): %v", name, bin, args, err)
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
			t.Logf("stderr of %s (last 8 KiB):\n%s", name, p.stderrTail())
		}
	})
	return p
}

type stderrWriter struct{ p *Proc }

func (w stderrWriter) Write(b []byte) (int, error) {
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

func (p *Proc) stderrTail() string {
	s := p.Stderr()
	if len(s) > 8<<10 {
		s = s[len(s)-8<<10:]
	}
	return s
}

// WaitMatch returns the submatches of the first stdout line matching re,
// or an error (with the stderr tail) if the process exits or timeout
// passes first. Lines read before the match are consumed.
func (p *Proc) WaitMatch(re *regexp.Regexp, timeout time.Duration) ([]string, error) {
	deadline := time.After(timeout)
	for {
		select {
		case l := <-p.lines:
			if m := re.FindStringSubmatch(l); m != nil {
				return m, nil
			}
		case <-p.done:
			return nil, fmt.Errorf("%s exited (%v) before printing a line matching %v; stderr:\n%s", p.name, p.Err(), re, p.stderrTail())
		case <-deadline:
			return nil, fmt.Errorf("%s printed no line matching %v within %v; stderr:\n%s", p.name, re, timeout, p.stderrTail())
		}
	}
}

// WaitLine is WaitMatch for the first line starting with prefix.
func (p *Proc) WaitLine(prefix string, timeout time.Duration) (string, error) {
	m, err := p.WaitMatch(regexp.MustCompile("^"+regexp.QuoteMeta(prefix)+".*"), timeout)
	if err != nil {
		return "", err
	}
	return m[0], nil
}

// Expect is WaitMatch that fails the test on error; call it from the test
// goroutine.
func (p *Proc) Expect(re *regexp.Regexp, timeout time.Duration) []string {
	p.t.Helper()
	m, err := p.WaitMatch(re, timeout)
	if err != nil {
		p.t.Fatal(err)
	}
	return m
}

// Stop sends sig (SIGINT, SIGTERM) and waits up to timeout for the process
// to exit, then kills it. It returns the exit error: nil for exit 0.
func (p *Proc) Stop(sig os.Signal, timeout time.Duration) error {
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return p.Err()
	case <-time.After(timeout):
		p.Kill()
		return fmt.Errorf("%s did not exit within %v of %v", p.name, timeout, sig)
	}
}

// Kill is a crash: SIGKILL, no clean-up in the process. It waits for the
// process to be gone.
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

// Err is the exit error once the process has exited (nil: exit 0).
func (p *Proc) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Fields parses the key=value words of a line.
func Fields(line string) map[string]string {
	m := map[string]string{}
	for _, w := range strings.Fields(line) {
		if k, v, ok := strings.Cut(w, "="); ok {
			m[k] = v
		}
	}
	return m
}
