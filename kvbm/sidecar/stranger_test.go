package sidecar

import (
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// strangerProbe connects to the socket, sends one frame and says whether a
// frame came back ("REPLY") or the connection was closed ("CLOSED").
const strangerProbe = `
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
s.connect(sys.argv[1])
try:
    s.sendall(bytes.fromhex(sys.argv[2]))
    b = s.recv(8)
except (BrokenPipeError, ConnectionResetError):
    b = b""  # closed before or after the frame went out
print("REPLY" if b else "CLOSED")
`

// TestStrangerRefused is the outsider's view: a process of another user
// that reaches the socket (its mode loosened, as in the window between bind
// and chmod) is disconnected before any frame is read, while the same
// probe run as the sidecar's own user is answered.
func TestStrangerRefused(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run the probe as another user")
	}
	// Debian's python3, which another user can run (a pyenv shim under
	// /root cannot).
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skip("no /usr/bin/python3 for the probe")
	}
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} { // t.TempDir's are 0700
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s := startServer(t, Config{Socket: filepath.Join(dir, "kvbm.sock")})
	if err := os.Chmod(s.Addr(), 0o666); err != nil {
		t.Fatal(err)
	}
	req, err := appendFrame(nil, KindRequest, map[string]any{"op": "no-such-op"})
	if err != nil {
		t.Fatal(err)
	}
	probe := func(stranger bool) string {
		cmd := exec.Command(py, "-c", strangerProbe, s.Addr(), hex.EncodeToString(req))
		if stranger {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("probe (stranger %v): %v\n%s", stranger, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if got := probe(false); got != "REPLY" {
		t.Fatalf("the sidecar's own user got %q, want a reply", got)
	}
	if got := probe(true); got != "CLOSED" {
		t.Fatalf("uid 65534 got %q, want the connection closed", got)
	}
}
