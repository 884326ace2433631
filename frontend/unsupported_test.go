package frontend

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Every entry of UnsupportedParameters is refused with a 400
// unsupported_parameter naming it, on each endpoint it names.
func TestUnsupportedParametersRefused(t *testing.T) {
	ts := newTestServer(t, &fakeBackend{reply: "ok"}, DefaultConfig())
	for _, p := range UnsupportedParameters {
		for _, ep := range []string{"chat", "completions"} {
			if p.Endpoint != "" && p.Endpoint != ep {
				continue
			}
			url, body := ts.URL+"/v1/chat/completions", `{"model":"test-model","messages":[{"role":"user","content":"hi"}],`+p.Example+`}`
			if ep == "completions" {
				url, body = ts.URL+"/v1/completions", `{"model":"test-model","prompt":"hi",`+p.Example+`}`
			}
			resp, out := post(t, url, body)
			var e struct {
				Error struct {
					Param *string
					Code  *string
				}
			}
			_ = json.Unmarshal([]byte(out), &e)
			if resp.StatusCode != 400 || e.Error.Param == nil || *e.Error.Param != p.Name || e.Error.Code == nil || *e.Error.Code != "unsupported_parameter" {
				t.Errorf("%s %s: %d %s, want 400 unsupported_parameter for %q", ep, p.Example, resp.StatusCode, out, p.Name)
			}
		}
	}
}

// Every parameter request.go refuses by name is in the table.
func TestUnsupportedTableCoversTheCode(t *testing.T) {
	src, err := os.ReadFile("request.go")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range UnsupportedParameters {
		names = append(names, p.Name)
	}
	calls := regexp.MustCompile(`unsupported\("([a-z_]+)"`).FindAllSubmatch(src, -1)
	if len(calls) == 0 {
		t.Fatal("no unsupported(...) call found in request.go")
	}
	for _, m := range calls {
		if !slices.Contains(names, string(m[1])) {
			t.Errorf("request.go refuses %q, which UnsupportedParameters lacks", m[1])
		}
	}
}

// docs/api.md lists exactly the table's refusals.
func TestAPIDocListsUnsupportedParameters(t *testing.T) {
	readme, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	want := "never silently ignored: " + UnsupportedList() + " ("
	// The page wraps lines: compare with its whitespace collapsed.
	if got := strings.Join(strings.Fields(string(readme)), " "); !strings.Contains(got, want) {
		t.Errorf("docs/api.md does not list the frontend's unsupported parameters; want the sentence\n%s", want)
	}
	if n := strings.Count(string(readme), "never silently ignored:"); n != 1 {
		t.Errorf("docs/api.md lists unsupported parameters %d times, want once", n)
	}
}
