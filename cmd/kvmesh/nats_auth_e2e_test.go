package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// natsAccount is an operator-mode NATS set-up: an operator, a system
// account and one JetStream-enabled account whose users kvmesh connects as.
type natsAccount struct {
	t          *testing.T
	opJWT      string
	sysPub     string
	sysJWT     string
	acctPub    string
	acctJWT    string
	acctSigner nkeys.KeyPair
}

func newNATSAccount(t *testing.T) *natsAccount {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	op, err := nkeys.CreateOperator()
	must(err)
	opPub, _ := op.PublicKey()
	a := &natsAccount{t: t}
	a.opJWT, err = jwt.NewOperatorClaims(opPub).Encode(op)
	must(err)
	account := func(name string, js bool) (string, string, nkeys.KeyPair) {
		kp, err := nkeys.CreateAccount()
		must(err)
		pub, _ := kp.PublicKey()
		c := jwt.NewAccountClaims(pub)
		c.Name = name
		if js {
			c.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		}
		enc, err := c.Encode(op)
		must(err)
		return pub, enc, kp
	}
	a.sysPub, a.sysJWT, _ = account("SYS", false)
	a.acctPub, a.acctJWT, a.acctSigner = account("KVMESH", true)
	return a
}

// creds writes a credentials file (user JWT + nkey seed) for a user the
// signer issued.
func (a *natsAccount) creds(name string, signer nkeys.KeyPair) string {
	a.t.Helper()
	u, err := nkeys.CreateUser()
	if err != nil {
		a.t.Fatal(err)
	}
	pub, _ := u.PublicKey()
	uc := jwt.NewUserClaims(pub)
	uc.Name = name
	ujwt, err := uc.Encode(signer)
	if err != nil {
		a.t.Fatal(err)
	}
	seed, _ := u.Seed()
	b, err := jwt.FormatUserConfig(ujwt, seed)
	if err != nil {
		a.t.Fatal(err)
	}
	p := filepath.Join(a.t.TempDir(), name+".creds")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		a.t.Fatal(err)
	}
	return p
}

var natsListening = regexp.MustCompile(`Listening for client connections on (\S+)`)

// startAuthNATS runs the module's nats-server in operator mode with TLS
// (the server certificate from pki) and JetStream, and returns its address.
func startAuthNATS(t *testing.T, a *natsAccount, pki *testutil.FleetPKI) string {
	t.Helper()
	dir := t.TempDir()
	conf := fmt.Sprintf(`listen: "127.0.0.1:-1"
jetstream { store_dir: %q }
operator: %q
system_account: %q
resolver: MEMORY
resolver_preload: {
  %s: %q
  %s: %q
}
tls { cert_file: %q, key_file: %q }
`, filepath.Join(dir, "js"), a.opJWT, a.sysPub, a.sysPub, a.sysJWT, a.acctPub, a.acctJWT, pki.CertFile, pki.KeyFile)
	cf := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := testutil.Start(t, "nats-server", natsServerBinary(t), nil, "-c", cf)
	var addr string
	testutil.WaitFor(t, 20*time.Second, "nats-server ready", func() bool {
		if m := natsListening.FindStringSubmatch(srv.Stderr()); m != nil && strings.Contains(srv.Stderr(), "Server is ready") {
			addr = m[1]
		}
		return addr != ""
	}, func() string { return srv.Stderr() })
	return addr
}

// kvmesh processes join an external nats-server that requires a user of its
// account (--nats-creds, operator mode) over TLS with a private CA
// (--nats-ca): a worker and a frontend serve a request. A user of an
// account the server does not trust, a missing CA, or no credentials at
// all stop the process at once with one error naming the flag to fix.
func TestNATSCredsAndTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	acct := newNATSAccount(t)
	pki := testutil.NewFleetPKI(t, "nats")
	addr := startAuthNATS(t, acct, pki)
	url := "tls://" + addr
	good := acct.creds("kvmesh", acct.acctSigner)
	join := []string{"--nats", url, "--nats-creds", good, "--nats-ca", pki.CAFile}

	w := startProc(t, "worker", append([]string{"worker", "--model", "nats-auth", "--speedup-ratio", "0", "--log-level", "warn"}, join...)...)
	w.Expect(workerLine, 30*time.Second)
	fe := startProc(t, "frontend", append([]string{"frontend", "--model", "nats-auth", "--listen", "127.0.0.1:0", "--log-level", "warn"}, join...)...)
	base := fe.Expect(frontendLine, 30*time.Second)[1]
	waitHealthy(t, base)
	resp, body := testutil.Post(t, base+"/chat/completions", `{"model":"nats-auth","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("through an authenticated NATS: %d %s", resp.StatusCode, body)
	}

	_, _, strangerSigner := func() (string, string, nkeys.KeyPair) {
		kp, err := nkeys.CreateAccount()
		if err != nil {
			t.Fatal(err)
		}
		return "", "", kp
	}()
	stranger := acct.creds("stranger", strangerSigner)
	garbage := filepath.Join(t.TempDir(), "garbage.creds")
	if err := os.WriteFile(garbage, []byte("not a creds file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"an untrusted account's user", []string{"--nats", url, "--nats-creds", stranger, "--nats-ca", pki.CAFile}, "--nats-creds " + stranger + ": the NATS server refused these credentials"},
		{"no credentials", []string{"--nats", url, "--nats-ca", pki.CAFile}, "--nats: the NATS server requires credentials"},
		{"a creds file that is none", []string{"--nats", url, "--nats-creds", garbage, "--nats-ca", pki.CAFile}, "--nats-creds " + garbage + ": not a usable NATS credentials file"},
		{"no CA", []string{"--nats", url, "--nats-creds", good}, "--nats-ca: the NATS server's certificate is not trusted"},
	} {
		cmds := []string{"worker"}
		if c.name == "no credentials" {
			cmds = append(cmds, "frontend") // the same flags, the same check
		}
		for _, cmd := range cmds {
			args := append([]string{cmd, "--model", "nats-auth", "--log-level", "warn"}, c.args...)
			if cmd == "frontend" {
				args = append(args, "--listen", "127.0.0.1:0")
			}
			p := startProc(t, cmd+" with "+c.name, args...)
			select {
			case <-p.Done():
			case <-time.After(20 * time.Second):
				t.Fatalf("%s with %s kept running", cmd, c.name)
			}
			stderr := strings.TrimSpace(p.Stderr())
			if p.Err() == nil || !strings.Contains(stderr, c.want) || strings.Count(stderr, "\n") > 1 {
				t.Errorf("%s with %s: exit %v, stderr:\n%s\nwant one line containing %q", cmd, c.name, p.Err(), stderr, c.want)
			}
		}
	}
}
