package natsbus

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// A NATS server that requires a user and password (as an operator's
// external nats-server would): kvmesh processes pass them in the --nats URL
// (nats://user:password@host:port); without them, or with a wrong password,
// the connection is refused.
func TestConnectWithUserPassword(t *testing.T) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true,
		Username: "kvmesh", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(5 * time.Second) {
		t.Fatal("nats server not ready")
	}
	addr := srv.Addr().String()
	nc, err := Connect(ConnConfig{URLs: fmt.Sprintf("nats://kvmesh:s3cret@%s", addr), Name: "auth-test"})
	if err != nil {
		t.Fatalf("with the password: %v", err)
	}
	if err := nc.Publish("kvmesh.test", []byte("x")); err != nil || nc.Flush() != nil {
		t.Fatalf("publish: %v", err)
	}
	nc.Close()
	for _, u := range []string{"nats://" + addr, "nats://kvmesh:wrong@" + addr} {
		nc, err := Connect(ConnConfig{URLs: u})
		if err == nil {
			nc.Close()
			t.Errorf("%s: connected without the right password", u)
		} else if strings.Contains(err.Error(), "wrong") {
			t.Errorf("the error shows the password: %v", err)
		}
	}
}
