package hints

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/kvmesh/kvmesh/kv"
)

// Protocol constants.
const (
	ProtocolVersion = "0.1"
	// ActionFetch asks the target to pull blocks from a peer's control endpoint.
	ActionFetch = "kv.fetch"
	// ActionSourceLocations is the legacy name of kv.fetch: accepted, never emitted.
	ActionSourceLocations = "kv.source_locations"
	// FetchVersion is the only kv.fetch schema this package interprets.
	FetchVersion = "1.0"
	// FetchActionID is the action id the router gives its single fetch action.
	FetchActionID = "a1"

	ModeCopy = "copy"
	ModeMove = "move"
)

// ErrMalformed matches (errors.Is) every validation error Parse returns.
var ErrMalformed = errors.New("malformed KV hint")

// ErrIgnored matches (errors.Is) the error Parse returns for an envelope whose
// protocol_version is not understood: the hint is to be ignored, not rejected.
var ErrIgnored = errors.New("KV hint ignored")

// Error is a precise validation error: Path names the offending field
// (e.g. "actions[0].payload.block_hashes[3]"), Msg says what is wrong.
type Error struct {
	Path string
	Msg  string
}

func (e *Error) Error() string        { return e.Path + ": " + e.Msg }
func (e *Error) Is(target error) bool { return target == ErrMalformed }

// IgnoredError reports an envelope with an unsupported protocol_version.
type IgnoredError struct{ Version string }

func (e *IgnoredError) Error() string {
	return fmt.Sprintf("protocol_version: unsupported %.64q (supported %q); hint ignored", e.Version, ProtocolVersion)
}
func (e *IgnoredError) Is(target error) bool { return target == ErrIgnored }

// Envelope is a parsed, validated hint.
type Envelope struct {
	ProtocolVersion string
	MessageID       string
	Actions         []Action
}

// Action is one entry of the envelope's actions list.
//
// Raw is exactly what Marshal emits for this action: for an action this
// package does not interpret it is the action as received, byte for byte;
// for an interpreted kv.fetch it is the normalised form. The other fields are
// read-only views of Raw. An Action built by hand with Raw empty is emitted
// from ID, Type, Version and Payload.
type Action struct {
	ID      string
	Type    string
	Version string
	Payload json.RawMessage
	Raw     json.RawMessage

	fetch *Fetch // non-nil for an interpreted kv.fetch@1.0
}

// Fetch is the interpreted payload of a kv.fetch@1.0 action.
type Fetch struct {
	// SourceEndpoint is the canonical peer control endpoint; "" when the
	// payload named none (fetch from local storage).
	SourceEndpoint string
	// BlockHashes are the source engine's own block hashes (kv.EngineHash)
	// in request order (root-aligned prefix as the router emits them).
	// Consumers should test membership, not positions: a router variant may
	// send a suffix range.
	BlockHashes []uint64
	// Mode is always ModeCopy after Parse (move is rejected as unsupported).
	Mode string
	// NoRetain is nil when absent.
	NoRetain *bool
}

func (f *Fetch) clone() *Fetch {
	c := *f
	c.BlockHashes = slices.Clone(f.BlockHashes)
	if f.NoRetain != nil {
		v := *f.NoRetain
		c.NoRetain = &v
	}
	return &c
}

// Fetch returns a copy of the first interpreted kv.fetch action's payload
// (KVCR semantics: the first kv.fetch wins).
func (e *Envelope) Fetch() (*Fetch, bool) {
	if e == nil {
		return nil, false
	}
	for i := range e.Actions {
		if f := e.Actions[i].fetch; f != nil {
			return f.clone(), true
		}
	}
	return nil, false
}

// NewFetch builds the router's envelope: message_id is the booking's
// selection id, one kv.fetch action "a1". endpoint should already be
// canonical (kv.ParseEndpoint); "" omits the source. hashes are copied.
func NewFetch(messageID, endpoint string, hashes []uint64) *Envelope {
	f := &Fetch{SourceEndpoint: endpoint, BlockHashes: slices.Clone(hashes), Mode: ModeCopy}
	return &Envelope{
		ProtocolVersion: ProtocolVersion,
		MessageID:       messageID,
		Actions:         []Action{newFetchAction(FetchActionID, f)},
	}
}

func newFetchAction(id string, f *Fetch) Action {
	a := Action{ID: id, Type: ActionFetch, Version: FetchVersion, fetch: f}
	a.Payload = appendFetchPayload(nil, f, false)
	a.Raw = appendAction(nil, id, ActionFetch, FetchVersion, a.Payload)
	return a
}

// Marshal emits the normalised envelope: fixed key order, interpreted
// kv.fetch actions in canonical form (mode omitted when it is the default
// "copy"), every other action exactly as received.
func (e *Envelope) Marshal() []byte { return e.appendTo(nil, false) }

// MarshalJSON implements json.Marshaler. encoding/json compacts the result,
// so whitespace inside opaque actions is not kept on this path.
func (e *Envelope) MarshalJSON() ([]byte, error) { return e.Marshal(), nil }

// appendTo writes the envelope; explicitMode forces "mode" into every
// interpreted fetch payload (SGLang re-emits it).
func (e *Envelope) appendTo(b []byte, explicitMode bool) []byte {
	b = append(b, `{"protocol_version":`...)
	b = appendString(b, e.ProtocolVersion)
	b = append(b, `,"message_id":`...)
	b = appendString(b, e.MessageID)
	b = append(b, `,"actions":[`...)
	for i := range e.Actions {
		if i > 0 {
			b = append(b, ',')
		}
		a := &e.Actions[i]
		switch {
		case a.fetch != nil && explicitMode:
			b = appendAction(b, a.ID, a.Type, a.Version, appendFetchPayload(nil, a.fetch, true))
		case len(a.Raw) > 0:
			b = append(b, a.Raw...)
		default:
			p := a.Payload
			if len(p) == 0 {
				p = json.RawMessage(`{}`)
			}
			b = appendAction(b, a.ID, a.Type, a.Version, p)
		}
	}
	return append(b, "]}"...)
}

func appendAction(b []byte, id, typ, version string, payload []byte) []byte {
	b = append(b, `{"action_id":`...)
	b = appendString(b, id)
	b = append(b, `,"action_type":`...)
	b = appendString(b, typ)
	b = append(b, `,"action_version":`...)
	b = appendString(b, version)
	b = append(b, `,"payload":`...)
	b = append(b, payload...)
	return append(b, '}')
}

func appendFetchPayload(b []byte, f *Fetch, explicitMode bool) []byte {
	b = append(b, '{')
	if f.SourceEndpoint != "" {
		b = append(b, `"source_control_endpoint":`...)
		b = appendString(b, f.SourceEndpoint)
		b = append(b, ',')
	}
	b = append(b, `"block_hashes":[`...)
	for i, h := range f.BlockHashes {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, h, 10)
	}
	b = append(b, ']')
	mode := f.Mode
	if mode == "" {
		mode = ModeCopy
	}
	if explicitMode || mode != ModeCopy {
		b = append(b, `,"mode":`...)
		b = appendString(b, mode)
	}
	if f.NoRetain != nil {
		b = append(b, `,"no_retain":`...)
		b = strconv.AppendBool(b, *f.NoRetain)
	}
	return append(b, '}')
}

func appendString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // a string always marshals
	return append(b, q...)
}

// Parse validates a hint envelope. It returns an *Error (ErrMalformed) naming
// the first offending field, an *IgnoredError (ErrIgnored) for an unknown
// protocol_version, or the envelope. It never panics on input. It neither
// logs nor counts: a consumer serving hints parses with its Parser, a tool
// (kvmesh hints validate) reports the outcome itself.
func Parse(data []byte) (*Envelope, error) { return parse(data, nil) }

// invalidJSON explains why data is not exactly one JSON value.
func invalidJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return &Error{"envelope", "invalid JSON: " + jsonErrText(err)}
	}
	if _, err := dec.Token(); err != io.EOF {
		return &Error{"envelope", "unexpected data after the JSON value"}
	}
	return &Error{"envelope", "invalid JSON"}
}

// parse validates; a non-nil serving Parser logs and counts what its
// consumer ignores.
func parse(data []byte, serving *Parser) (*Envelope, error) {
	// One validating pass; everything below splits trusted JSON.
	if !json.Valid(data) {
		return nil, invalidJSON(data)
	}
	// Copy: opaque actions keep raw slices, and the caller may reuse data.
	raw := bytes.Clone(bytes.TrimSpace(data))
	top, err := object("envelope", raw)
	if err != nil {
		return nil, err
	}
	pv, err := stringField(top, "", "protocol_version")
	if err != nil {
		return nil, err
	}
	if pv != ProtocolVersion {
		if serving == nil {
			return nil, &IgnoredError{Version: pv}
		}
		serving.warnOnce("protocol:"+clip(pv), "KV hint protocol_version mismatch; hint ignored", "supported", ProtocolVersion, "received", clip(pv))
		return nil, &IgnoredError{Version: pv}
	}
	mid, err := stringField(top, "", "message_id")
	if err != nil {
		return nil, err
	}
	if err := checkName("message_id", mid); err != nil {
		return nil, err
	}
	actsRaw, ok := top["actions"]
	if !ok {
		return nil, &Error{"actions", "missing"}
	}
	if k := kind(actsRaw); k != "list" {
		return nil, &Error{"actions", "must be a list, got " + k}
	}
	acts, err := splitList(actsRaw)
	if err != nil {
		return nil, &Error{"actions", "invalid: " + jsonErrText(err)}
	}
	if len(acts) > MaxActions {
		return nil, &Error{"actions", fmt.Sprintf("%d actions, limit %d", len(acts), MaxActions)}
	}
	env := &Envelope{ProtocolVersion: pv, MessageID: mid, Actions: make([]Action, 0, len(acts))}
	var skippedActs []Action
	legacy := 0
	for i, ar := range acts {
		a, disp, err := parseAction(fmt.Sprintf("actions[%d]", i), ar)
		if err != nil {
			return nil, err
		}
		switch disp {
		case skipped, skippedDropped:
			skippedActs = append(skippedActs, a)
		case legacyConverted:
			legacy++
		}
		if disp != skippedDropped {
			env.Actions = append(env.Actions, a)
		}
	}
	if serving == nil {
		return env, nil
	}
	// Count only once the whole envelope is accepted.
	for _, a := range skippedActs {
		serving.skippedActions.Add(1)
		serving.warnOnce("action:"+a.Type+"@"+clip(a.Version), "KV hint action_version not supported; action skipped",
			"action_type", a.Type, "supported", FetchVersion, "received", clip(a.Version))
	}
	serving.legacyConverted.Add(uint64(legacy))
	return env, nil
}

// disposition says what parseAction did with an action.
type disposition int

const (
	kept            disposition = iota // interpreted, or opaque
	legacyConverted                    // kv.source_locations turned into kv.fetch
	skipped                            // kv.fetch of an unknown version: carried opaquely
	skippedDropped                     // legacy name of an unknown version: dropped
)

func parseAction(path string, raw json.RawMessage) (Action, disposition, error) {
	m, err := object(path, raw)
	if err != nil {
		return Action{}, kept, err
	}
	var a Action
	if a.ID, err = actionField(m, path+".", "action_id"); err != nil {
		return a, kept, err
	}
	if a.Type, err = actionField(m, path+".", "action_type"); err != nil {
		return a, kept, err
	}
	if a.Type == "" {
		return a, kept, &Error{path + ".action_type", "must not be empty"}
	}
	if a.Version, err = actionField(m, path+".", "action_version"); err != nil {
		return a, kept, err
	}
	for _, f := range [...]struct{ name, v string }{{"action_id", a.ID}, {"action_type", a.Type}, {"action_version", a.Version}} {
		if err := checkName(path+"."+f.name, f.v); err != nil {
			return a, kept, err
		}
	}
	p, ok := m["payload"]
	if !ok {
		return a, kept, &Error{path + ".payload", "missing"}
	}
	if k := kind(p); k != "object" {
		return a, kept, &Error{path + ".payload", "must be an object, got " + k}
	}
	a.Payload, a.Raw = p, raw

	if a.Type != ActionFetch && a.Type != ActionSourceLocations {
		return a, kept, nil // opaque: round-trips as received
	}
	if a.Version != FetchVersion {
		// An unknown kv.fetch version travels on opaquely; a legacy name is never emitted.
		if a.Type == ActionFetch {
			return a, skipped, nil
		}
		return a, skippedDropped, nil
	}
	f, err := parseFetch(path+".payload", p)
	if err != nil {
		return a, kept, err
	}
	if a.Type == ActionSourceLocations {
		return newFetchAction(a.ID, f), legacyConverted, nil
	}
	return newFetchAction(a.ID, f), kept, nil
}

func parseFetch(path string, raw json.RawMessage) (*Fetch, error) {
	m, err := object(path, raw)
	if err != nil {
		return nil, err
	}
	f := &Fetch{Mode: ModeCopy}
	if ep, ok := m["source_control_endpoint"]; ok && kind(ep) != "null" {
		p := path + ".source_control_endpoint"
		if k := kind(ep); k != "string" {
			return nil, &Error{p, "must be a non-empty tcp://host:port string, got " + k}
		}
		var s string
		if err := json.Unmarshal(ep, &s); err != nil {
			return nil, &Error{p, "invalid string: " + jsonErrText(err)}
		}
		src, err := kv.ParseEndpoint(s)
		if err != nil {
			return nil, &Error{p, err.Error()}
		}
		f.SourceEndpoint = src.String()
	}
	hp := path + ".block_hashes"
	hr, ok := m["block_hashes"]
	if !ok {
		return nil, &Error{hp, "missing"}
	}
	if k := kind(hr); k != "list" {
		return nil, &Error{hp, "must be a list of integers, got " + k}
	}
	hashes, bad := scanUints(hr)
	if bad >= 0 {
		// Slow path, only to name the offending element precisely.
		var elems []json.RawMessage
		if err := json.Unmarshal(hr, &elems); err != nil {
			return nil, &Error{hp, "invalid: " + jsonErrText(err)}
		}
		return nil, &Error{fmt.Sprintf("%s[%d]", hp, bad), "must be an integer in [0, 2^64), got " + show(elems[bad])}
	}
	switch {
	case len(hashes) == 0:
		return nil, &Error{hp, "must not be empty"}
	case len(hashes) > kv.MaxHintBlocks:
		return nil, &Error{hp, fmt.Sprintf("%d hashes, a fetch takes at most %d", len(hashes), kv.MaxHintBlocks)}
	}
	f.BlockHashes = hashes
	if mr, ok := m["mode"]; ok {
		var mode string
		if kind(mr) != "string" || json.Unmarshal(mr, &mode) != nil || (mode != ModeCopy && mode != ModeMove) {
			return nil, &Error{path + ".mode", `must be "copy" or "move", got ` + show(mr)}
		}
		if mode == ModeMove {
			return nil, &Error{path + ".mode", `"move" is not supported (only "copy")`}
		}
	}
	if nr, ok := m["no_retain"]; ok {
		var v bool
		if kind(nr) != "bool" || json.Unmarshal(nr, &v) != nil {
			return nil, &Error{path + ".no_retain", "must be a bool, got " + show(nr)}
		}
		f.NoRetain = &v
	}
	return f, nil
}

// scanUints parses a JSON list (already validated by the decoder) whose
// elements must all be plain unsigned integers < 2^64. It returns the values,
// or the index of the first element that is not one (bools, strings,
// negatives, fractions such as 1.0, exponents such as 1e3, values >= 2^64,
// nested values all fail, since ParseUint accepts only digits).
func scanUints(list []byte) ([]uint64, int) {
	i := skipSpace(list, 0) + 1 // past '['
	i = skipSpace(list, i)
	if i < len(list) && list[i] == ']' {
		return nil, -1
	}
	out := make([]uint64, 0, len(list)/8)
	for idx := 0; ; idx++ {
		j := i
		for j < len(list) && list[j] >= '0' && list[j] <= '9' {
			j++
		}
		v, err := strconv.ParseUint(string(list[i:j]), 10, 64)
		if err != nil {
			return nil, idx
		}
		out = append(out, v)
		j = skipSpace(list, j)
		if j >= len(list) {
			return nil, idx
		}
		switch list[j] {
		case ',':
			i = skipSpace(list, j+1)
		case ']':
			return out, -1
		default: // e.g. "1.5": digits followed by more of the same element
			return nil, idx
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// object decodes raw as a JSON object, keeping values raw. Keys match
// exactly (no case folding, unlike struct decoding); a repeated key is an
// error.
func object(path string, raw json.RawMessage) (map[string]json.RawMessage, error) {
	if k := kind(raw); k != "object" {
		return nil, &Error{path, "must be an object, got " + k}
	}
	m, err := splitObject(raw)
	if err != nil {
		return nil, &Error{path, "invalid object: " + jsonErrText(err)}
	}
	return m, nil
}

func stringField(m map[string]json.RawMessage, prefix, name string) (string, error) {
	raw, ok := m[name]
	if !ok {
		return "", &Error{prefix + name, "missing"}
	}
	if k := kind(raw); k != "string" {
		return "", &Error{prefix + name, "must be a string, got " + k}
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", &Error{prefix + name, "invalid string: " + jsonErrText(err)}
	}
	return s, nil
}

// kind names the JSON type of an already-validated value.
func kind(raw []byte) string {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "object"
	case '[':
		return "list"
	case '"':
		return "string"
	case 't', 'f':
		return "bool"
	case 'n':
		return "null"
	default:
		return "number"
	}
}

// show renders a raw JSON value for an error message, truncated.
func show(raw []byte) string {
	const max = 40
	s := string(bytes.TrimSpace(raw))
	if len(s) > max {
		s = s[:max] + "…"
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// MaxActions bounds an envelope's actions: one kv.fetch is what kvmesh
// sends, a few more what a newer sender might add.
const MaxActions = 16

// checkName enforces kv.MaxHintIDLen and refuses control characters in an
// id or name, which would reach logs and engines as they are.
func checkName(path, s string) error {
	if len(s) > kv.MaxHintIDLen {
		return &Error{path, fmt.Sprintf("%d bytes, limit %d", len(s), kv.MaxHintIDLen)}
	}
	if i := strings.IndexFunc(s, unicode.IsControl); i >= 0 {
		return &Error{path, fmt.Sprintf("control character %U at byte %d", []rune(s[i:])[0], i)}
	}
	return nil
}

// clip bounds attacker-chosen strings before they reach logs.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64]
	}
	return s
}

// jsonErrText strips the package prefix from encoding/json errors.
func jsonErrText(err error) string {
	return strings.TrimPrefix(err.Error(), "json: ")
}
