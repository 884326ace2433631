package remote

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// halfFrame writes a field, then declines: the reader must decode the
// frame from a zero value with encoding/json.
type halfFrame struct {
	A []int `json:"a"`
	B string
}

func (h *halfFrame) DecodeFrame([]byte) bool {
	h.A, h.B = []int{9}, "partial"
	return false
}

func TestReadFramesFallsBackFromADeclinedFrame(t *testing.T) {
	body := "data: {\"a\":[1]}\n\ndata: [DONE]\n\n"
	var got []halfFrame
	err := ReadFrames(context.Background(), strings.NewReader(body), func() bool { return false }, func(f *halfFrame) error {
		got = append(got, *f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || len(got[0].A) != 1 || got[0].A[0] != 1 || got[0].B != "" {
		t.Fatalf("frames %+v, want one {A:[1]} decoded from zero", got)
	}
}

var scanInputs = []string{
	`{"a":[1,-2.5e+3,0.1,"x\u00e9\n",true,false,null,{}],"b":{"c":[]}}`,
	` [ ] `, `"s"`, `0`, `-0`, `1E9`, `01`, `1.`, `.5`, `-`, `1e`, `"\x"`, `"\u12g4"`, "\"a\tb\"",
	`{"a" 1}`, `{"a":1,}`, `[1,]`, `{"a":1`, `tru`, `nul`, `{"k\"ey":1}`, `{1:2}`,
}

// TestScanSkipIsStrict: Skip takes only valid JSON.
func TestScanSkipIsStrict(t *testing.T) {
	for _, in := range scanInputs {
		checkSkip(t, []byte(in))
	}
	if s := NewScan([]byte(scanInputs[0])); !s.Skip() || !s.End() {
		t.Fatal("Skip declined a valid object")
	}
}

func checkSkip(t *testing.T, data []byte) {
	t.Helper()
	s := NewScan(data)
	if s.Skip() && s.End() && !json.Valid(data) {
		t.Fatalf("Skip took %q, which is not JSON", data)
	}
}

func FuzzScanSkip(f *testing.F) {
	for _, in := range scanInputs {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkSkip(t, data) })
}

var stringInputs = []string{
	`"plain"`, `"a\"b\\c\/d\b\f\n\r\t"`, `"\u00e9\u4e2d"`, `"\ud83d\ude00"`, `"\ud800"`, `"\ud800x"`,
	`"\ud800\u0041"`, `"\udc00\ud800"`, `"\ud800\uZZZZ"`, "\"caf\xc3\xa9\"", "\"bad \xff\xfe utf8\"", "\"\xe4\xb8\"",
	`"\u0000"`, `"unterminated`, `"\x"`,
}

// TestScanStringMatchesJSON: String decodes as encoding/json does.
func TestScanStringMatchesJSON(t *testing.T) {
	for _, in := range stringInputs {
		checkString(t, []byte(in))
	}
}

func checkString(t *testing.T, data []byte) {
	t.Helper()
	s := NewScan(data)
	got, ok := s.String()
	var want string
	err := json.Unmarshal(data, &want)
	if ok && s.End() {
		if err != nil {
			t.Fatalf("String took %q, encoding/json refuses it: %v", data, err)
		}
		if got != want {
			t.Fatalf("%q: String %q, encoding/json %q", data, got, want)
		}
	}
}

func FuzzScanString(f *testing.F) {
	for _, in := range stringInputs {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkString(t, data) })
}
