// Package tracefile loads Mooncake-style request traces and expands their
// 512-token hash-id blocks into engine tokens and block hashes. It is the
// low-level reader the index benchmark, the load generator and the twin
// share; it imports only kv and internal/mix.
package tracefile

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/kvmesh/kvmesh/internal/mix"
	"github.com/kvmesh/kvmesh/kv"
)

// DefaultTraceBlockSize is the token count one Mooncake hash id covers.
const DefaultTraceBlockSize = 512

// Request is one trace line.
type Request struct {
	Line         int   // 1-based line number in the source
	TimestampMS  int64 // arrival, milliseconds from the trace start
	InputLength  int   // prompt tokens
	OutputLength int   // generated tokens
	HashIDs      []uint64
}

// LineError is one malformed line.
type LineError struct {
	Line int
	Err  error
}

func (e LineError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }

func (e LineError) Unwrap() error { return e.Err }

// Options control parsing.
type Options struct {
	// Strict makes the first malformed line fail the whole parse.
	Strict bool
	// TraceBlockSize is the tokens per hash id (default 512); a line whose
	// hash_ids do not number ceil(input_length/TraceBlockSize) is malformed.
	// Negative disables the check.
	TraceBlockSize int
	// MaxLines stops after this many non-empty lines (0: all).
	MaxLines int
}

type rawLine struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int64   `json:"input_length"`
	OutputLength *int64   `json:"output_length"`
	HashIDs      []int64  `json:"hash_ids"`
}

// Parse reads JSONL from r. Malformed lines are returned in errs (with their
// line numbers) and skipped; in strict mode the first one is returned as err.
// err is also set when r itself fails.
func Parse(r io.Reader, opt Options) (reqs []Request, errs []LineError, err error) {
	tbs := opt.TraceBlockSize
	if tbs == 0 {
		tbs = DefaultTraceBlockSize
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	line, n := 0, 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if opt.MaxLines > 0 && n >= opt.MaxLines {
			break
		}
		n++
		req, perr := parseLine(b, tbs)
		if perr != nil {
			le := LineError{Line: line, Err: perr}
			if opt.Strict {
				return reqs, append(errs, le), le
			}
			errs = append(errs, le)
			continue
		}
		req.Line = line
		reqs = append(reqs, req)
	}
	if serr := sc.Err(); serr != nil {
		return reqs, errs, fmt.Errorf("reading trace after line %d: %w", line, serr)
	}
	return reqs, errs, nil
}

// Load parses the trace file at path.
func Load(path string, opt Options) ([]Request, []LineError, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("open trace: %w", err)
	}
	defer f.Close()
	reqs, errs, err := Parse(f, opt)
	if err != nil {
		return reqs, errs, fmt.Errorf("%s: %w", path, err)
	}
	return reqs, errs, nil
}

func parseLine(b []byte, tbs int) (Request, error) {
	var raw rawLine
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&raw); err != nil {
		return Request{}, fmt.Errorf("invalid JSON: %w", err)
	}
	if dec.More() {
		return Request{}, errors.New("trailing data after the JSON object")
	}
	switch {
	case raw.Timestamp == nil:
		return Request{}, errors.New("missing timestamp")
	case raw.InputLength == nil:
		return Request{}, errors.New("missing input_length")
	case raw.HashIDs == nil:
		return Request{}, errors.New("missing hash_ids")
	case *raw.Timestamp < 0:
		return Request{}, fmt.Errorf("negative timestamp %v", *raw.Timestamp)
	case *raw.InputLength < 0 || *raw.InputLength > 1<<31:
		return Request{}, fmt.Errorf("input_length %d out of range", *raw.InputLength)
	}
	out := int64(0)
	if raw.OutputLength != nil {
		out = *raw.OutputLength
		if out < 0 || out > 1<<31 {
			return Request{}, fmt.Errorf("output_length %d out of range", out)
		}
	}
	ids := make([]uint64, len(raw.HashIDs))
	for i, h := range raw.HashIDs {
		if h < 0 {
			return Request{}, fmt.Errorf("hash_ids[%d] = %d is negative", i, h)
		}
		ids[i] = uint64(h)
	}
	in := int(*raw.InputLength)
	if tbs > 0 {
		if want := (in + tbs - 1) / tbs; want != len(ids) {
			return Request{}, fmt.Errorf("%d hash_ids for input_length %d, want %d at %d tokens per id", len(ids), in, want, tbs)
		}
	}
	return Request{TimestampMS: int64(*raw.Timestamp), InputLength: in, OutputLength: int(out), HashIDs: ids}, nil
}

// TokenLen is how many prompt tokens req expands to: its input length,
// capped at what its hash ids cover.
func TokenLen(req *Request, traceBlockSize int) int {
	n := len(req.HashIDs) * traceBlockSize
	if req.InputLength < n {
		n = req.InputLength
	}
	if n < 0 {
		n = 0
	}
	return n
}

// Token is token j (0-based) of the trace block with hash id h: a
// splitmix64 stream keyed by h, so equal ids give equal tokens and
// different ids differ with overwhelming probability.
func Token(h uint64, j int) kv.Token {
	return kv.Token(mix.Mix64(h*mix.Golden + uint64(j+1)*0xD1B54A32D192ED03))
}

// Tokens expands req into its prompt tokens: hash id i fills tokens
// [i·tbs, (i+1)·tbs), and the last id only up to the input length.
func Tokens(req *Request, traceBlockSize int) []kv.Token {
	return AppendTokens(nil, req, traceBlockSize)
}

// AppendTokens appends req's prompt tokens to dst.
func AppendTokens(dst []kv.Token, req *Request, traceBlockSize int) []kv.Token {
	if traceBlockSize <= 0 {
		return dst
	}
	n := TokenLen(req, traceBlockSize)
	for i := 0; i < n; i++ {
		dst = append(dst, Token(req.HashIDs[i/traceBlockSize], i%traceBlockSize))
	}
	return dst
}

// Expander computes engine block hashes of trace requests without
// materialising whole prompts: it fills one engine block of tokens at a
// time into a reused buffer and hashes it. Not safe for concurrent use.
type Expander struct {
	TraceBlockSize, BlockSize int
	Seed                      uint64
	buf                       []kv.Token
}

// NewExpander returns an Expander for the given sizes and hash seed
// (kv.BaseSeed for requests without LoRA or salt).
func NewExpander(traceBlockSize, blockSize int, seed uint64) *Expander {
	return &Expander{TraceBlockSize: traceBlockSize, BlockSize: blockSize, Seed: seed}
}

// LocalHashes appends the local hashes of req's full engine blocks to dst;
// they equal kv.LocalHashes(Tokens(req), BlockSize, Seed).
func (e *Expander) LocalHashes(dst []kv.LocalHash, req *Request) []kv.LocalHash {
	tbs, bs := e.TraceBlockSize, e.BlockSize
	if tbs <= 0 || bs <= 0 {
		return dst
	}
	n := kv.NumFullBlocks(TokenLen(req, tbs), bs)
	if cap(e.buf) < bs {
		e.buf = make([]kv.Token, bs)
	}
	tok := e.buf[:bs]
	for b := 0; b < n; b++ {
		for j := range tok {
			p := b*bs + j
			tok[j] = Token(req.HashIDs[p/tbs], p%tbs)
		}
		dst = append(dst, kv.HashTokens(tok, e.Seed))
	}
	return dst
}
