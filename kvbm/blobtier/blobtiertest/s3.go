// Package blobtiertest runs an S3-compatible server in process for tests
// of the object tier: gofakes3 over its in-memory backend on a loopback
// httptest server, with a credential check in front (gofakes3 checks
// none) so a wrong access key is refused as S3 refuses it. It is for
// tests only; nothing in the binary imports it. It imports gofakes3 and
// the standard library, nothing of kvmesh.
package blobtiertest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// The credentials the server accepts; Env hands them to a client.
const (
	AccessKey = "AKIAKVMESHTEST000001"
	SecretKey = "kvmesh-test-secret"
	Region    = "us-east-1"
)

// S3 is a running in-process S3 server.
type S3 struct {
	srv      *httptest.Server
	backend  *s3mem.Backend
	requests atomic.Int64
	denied   atomic.Int64
}

// NewS3 starts a server holding the given (empty) buckets; it stops when
// the test ends.
func NewS3(t testing.TB, buckets ...string) *S3 {
	t.Helper()
	s := &S3{backend: s3mem.New()}
	for _, b := range buckets {
		if err := s.backend.CreateBucket(b); err != nil {
			t.Fatal(err)
		}
	}
	fake := gofakes3.New(s.backend, gofakes3.WithLogger(gofakes3.DiscardLog()))
	h := fake.Server()
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		if keyID(r) != AccessKey {
			s.denied.Add(1)
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusForbidden)
			if r.Method != http.MethodHead { // HEAD answers carry no body, as S3's
				fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidAccessKeyId</Code>`+
					`<Message>The AWS Access Key Id you provided does not exist in our records.</Message></Error>`)
			}
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// keyID is the access key a SigV4 request is signed with ("" unsigned).
func keyID(r *http.Request) string {
	_, cred, ok := strings.Cut(r.Header.Get("Authorization"), "Credential=")
	if !ok {
		return r.URL.Query().Get("X-Amz-Credential") // presigned
	}
	id, _, _ := strings.Cut(cred, "/")
	return id
}

// Endpoint is the server's base URL (http://127.0.0.1:port).
func (s *S3) Endpoint() string { return s.srv.URL }

// URL is an s3:// bucket URL that reaches this server, extra query
// parameters (k=v&…) appended.
func (s *S3) URL(bucket string, extra ...string) string {
	q := "endpoint=" + url.QueryEscape(s.srv.URL) + "&region=" + Region + "&use_path_style=true"
	for _, e := range extra {
		q += "&" + e
	}
	return "s3://" + bucket + "?" + q
}

// Env is the environment that gives an AWS SDK client this server's
// credentials and nothing else: the shared config files point into dir
// (absent files), and the instance-metadata lookup is off.
func Env(dir, accessKey string) []string {
	return []string{
		"AWS_ACCESS_KEY_ID=" + accessKey,
		"AWS_SECRET_ACCESS_KEY=" + SecretKey,
		"AWS_SESSION_TOKEN=",
		"AWS_PROFILE=",
		"AWS_REGION=",
		"AWS_DEFAULT_REGION=",
		"AWS_CONFIG_FILE=" + filepath.Join(dir, "aws-config"),
		"AWS_SHARED_CREDENTIALS_FILE=" + filepath.Join(dir, "aws-credentials"),
		"AWS_EC2_METADATA_DISABLED=true",
	}
}

// SetEnv sets Env(t.TempDir(), accessKey) for the rest of the test (and
// the processes it starts).
func SetEnv(t testing.TB, accessKey string) {
	t.Helper()
	for _, kv := range Env(t.TempDir(), accessKey) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
}

// Objects is how many objects the bucket holds under prefix.
func (s *S3) Objects(t testing.TB, bucket, prefix string) int {
	t.Helper()
	p := gofakes3.NewPrefix(&prefix, nil)
	list, err := s.backend.ListBucket(bucket, &p, gofakes3.ListBucketPage{})
	if err != nil {
		t.Fatal(err)
	}
	return len(list.Contents)
}

// Requests is how many requests the server has answered, and how many of
// them it refused for their credentials.
func (s *S3) Requests() (all, denied int64) { return s.requests.Load(), s.denied.Load() }
