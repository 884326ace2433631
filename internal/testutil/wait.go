package testutil

import (
	"testing"
	"time"
)

// WaitFor polls cond every few milliseconds until it holds, and fails the
// test if it still does not after d. why, if given, is called on failure
// to say what was seen instead.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool, why ...func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			msg := ""
			if len(why) > 0 {
				msg = ": " + why[0]()
			}
			t.Fatalf("timed out after %v waiting for %s%s", d, what, msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
