package natsbus

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// DiscoveryBucket is the JetStream KV bucket of worker records
// (discovery.DefaultBucket); the permissions below name its subjects.
const DiscoveryBucket = "kvmesh_instances"

// Role is what a NATS identity may do on the embedded server.
type Role uint8

const (
	// RoleWorker publishes its own events and load and writes its own
	// discovery key, nothing else.
	RoleWorker Role = iota + 1
	// RoleFrontend reads discovery, events and load, and speaks the
	// routers' replica sync.
	RoleFrontend
	// roleAdmin is the process that runs the embedded server (serve and its
	// in-process workers); its key is random, never derived from the token.
	roleAdmin
)

// Identity names one client of the embedded server.
type Identity struct {
	Role Role
	// Instance is a worker's instance id (RoleWorker only).
	Instance uint64
}

// WorkerIdentity and FrontendIdentity are the identities a fleet token
// can prove.
func WorkerIdentity(instance uint64) Identity { return Identity{Role: RoleWorker, Instance: instance} }

// FrontendIdentity: see WorkerIdentity.
func FrontendIdentity() Identity { return Identity{Role: RoleFrontend} }

// User is the NATS user name the identity connects as.
func (id Identity) User() string {
	switch id.Role {
	case RoleWorker:
		return "worker." + InstanceToken(id.Instance)
	case RoleFrontend:
		return "frontend"
	case roleAdmin:
		return "admin"
	}
	return ""
}

func parseUser(user string) (Identity, bool) {
	switch {
	case user == "frontend":
		return FrontendIdentity(), true
	case user == "admin":
		return Identity{Role: roleAdmin}, true
	case strings.HasPrefix(user, "worker."):
		id, err := ParseInstanceToken(user)
		if err != nil || id == 0 || user != "worker."+InstanceToken(id) {
			return Identity{}, false
		}
		return WorkerIdentity(id), true
	}
	return Identity{}, false
}

// Credential proves an identity to the embedded server: the user name, and
// an nkey that signs the nonce the server sends on each connection, so
// nothing reusable crosses the wire.
type Credential struct {
	id Identity
	kp nkeys.KeyPair
}

// FleetCredential is the credential of id under the fleet's NATS key
// (fleetkey.Derive(token, fleetkey.NATS)): the nkey seed is
// HMAC-SHA256(key, user name), so the server, knowing the key, knows every
// identity's public key without a list.
func FleetCredential(key []byte, id Identity) (*Credential, error) {
	if len(key) == 0 {
		return nil, errors.New("nats credential: no fleet key")
	}
	if id.Role != RoleWorker && id.Role != RoleFrontend || id.Role == RoleWorker && id.Instance == 0 {
		return nil, fmt.Errorf("nats credential: identity %q cannot be derived from the fleet key", id.User())
	}
	return deriveCredential(key, id)
}

func deriveCredential(key []byte, id Identity) (*Credential, error) {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("user:" + id.User()))
	kp, err := nkeys.FromRawSeed(nkeys.PrefixByteUser, mac.Sum(nil))
	if err != nil {
		return nil, fmt.Errorf("nats credential: %w", err)
	}
	return &Credential{id: id, kp: kp}, nil
}

// NewAdminCredential draws a random key for the process that runs the
// embedded server; give it to EmbeddedConfig.Admin to keep it across a
// restart of the server.
func NewAdminCredential() (*Credential, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("nats admin credential: %w", err)
	}
	return &Credential{id: Identity{Role: roleAdmin}, kp: kp}, nil
}

// User is the identity's user name.
func (c *Credential) User() string { return c.id.User() }

// Options are the nats.go options that present the credential.
func (c *Credential) Options() []nats.Option {
	return []nats.Option{nats.UserInfo(c.User(), ""), nats.Nkey(c.public(), c.kp.Sign)}
}

func (c *Credential) public() string {
	pub, _ := c.kp.PublicKey()
	return pub
}

// fleetAuth is the embedded server's authenticator: a client names its
// identity as the user and signs the server's nonce with that identity's
// key; it is then bound to the identity's subject permissions.
type fleetAuth struct {
	key   []byte
	admin string // the admin credential's public key
}

func (a *fleetAuth) Check(c server.ClientAuthentication) bool {
	if c.Kind() != server.CLIENT {
		return false
	}
	o := c.GetOpts()
	id, ok := parseUser(o.Username)
	if !ok || o.Nkey == "" || o.Sig == "" {
		return false
	}
	want := a.admin
	if id.Role != roleAdmin {
		cred, err := deriveCredential(a.key, id)
		if err != nil {
			return false
		}
		want = cred.public()
	}
	if o.Nkey != want {
		return false
	}
	sig, err := base64.RawURLEncoding.DecodeString(o.Sig)
	if err != nil {
		if sig, err = base64.StdEncoding.DecodeString(o.Sig); err != nil {
			return false
		}
	}
	pub, err := nkeys.FromPublicKey(want)
	if err != nil || pub.Verify(c.GetNonce(), sig) != nil {
		return false
	}
	c.RegisterUser(&server.User{Username: o.Username, Permissions: Permissions(id)})
	return true
}

// Permissions are the subjects an identity may publish and subscribe to
// (nil: all, the admin). A KV put is a publish on $KV.<bucket>.<key>, so a
// worker's single allowed key is its whole write access to discovery; it
// may neither delete the stream nor its messages (no $JS.API.STREAM.DELETE,
// PURGE or MSG.DELETE), nor publish on another instance's subjects.
// docs/security.md lists the same set for an external server.
func Permissions(id Identity) *server.Permissions {
	stream := "KV_" + DiscoveryBucket
	bucketAPI := []string{"$JS.API.INFO", "$JS.API.STREAM.INFO." + stream, "$JS.API.STREAM.CREATE." + stream}
	switch id.Role {
	case RoleWorker:
		inst := InstanceToken(id.Instance)
		return &server.Permissions{
			Publish: &server.SubjectPermission{Allow: append(bucketAPI,
				SubjectPrefix+".events.*."+inst,
				SubjectPrefix+".load.*."+inst,
				"$KV."+DiscoveryBucket+".*."+inst)},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
		}
	case RoleFrontend:
		return &server.Permissions{
			Publish: &server.SubjectPermission{Allow: append(bucketAPI,
				"$JS.API.CONSUMER.CREATE."+stream, "$JS.API.CONSUMER.CREATE."+stream+".>",
				"$JS.API.CONSUMER.INFO."+stream+".>", "$JS.API.CONSUMER.DELETE."+stream+".>",
				"$JS.FC."+stream+".>",
				SubjectPrefix+".sync.>")},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>",
				SubjectPrefix + ".events.>", SubjectPrefix + ".load.>", SubjectPrefix + ".sync.>"}},
		}
	}
	return nil
}
