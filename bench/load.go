package bench

// `kvmesh bench load`: an online load generator for any OpenAI-compatible
// endpoint. It replays a Mooncake trace (prompt text rebuilt from hash ids)
// or a synthetic shared-prefix workload, open loop (trace timestamps or
// Poisson) or closed loop (fixed concurrency), streams every response and
// reports aiperf's client-side metrics.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvmesh/kvmesh/internal/mix"
	"github.com/kvmesh/kvmesh/tracefile"
)

// LoadConfig configures RunLoad. Exactly one workload (TracePath or
// Synthetic) and at most one of Concurrency and Rate must be set; a trace
// with neither is replayed on its timestamps.
type LoadConfig struct {
	URL      string // API base, e.g. http://host:8000/v1 ("/v1" is added to a bare host)
	Model    string // empty: the first model of GET /models
	Endpoint string // "chat" (default) or "completions"
	APIKey   string // sent as a bearer token when set

	TracePath      string
	Speedup        float64 // trace timestamps are divided by this; default 1
	Strict         bool    // a malformed trace line fails the run instead of being skipped
	TraceBlockSize int     // tokens per hash id; default 512

	Synthetic *SyntheticConfig

	Concurrency int     // closed loop with this many requests in flight
	Rate        float64 // open loop, Poisson arrivals per second
	MaxInFlight int     // open-loop cap on requests in flight; default 4096
	Requests    int     // stop after this many requests (0: the whole workload)
	Seed        uint64  // Poisson arrivals and synthetic order
	// Salt, when not 0, is mixed into every block id, so runs of different
	// salts share no prompt prefix: each meets a cache cold for it (a
	// ladder's steps against one server).
	Salt uint64

	IgnoreEOS bool  // send min_tokens = max_tokens and ignore_eos
	Goodput   []SLO // SLOs a request must meet to count as good

	Timeout  time.Duration // per request, default 10 min
	Duration time.Duration // overall deadline for sending (0: none)
	Grace    time.Duration // after cancellation or the deadline, in-flight requests get this long; default 5 s

	OutDir string // report.json, requests.jsonl, summary.md and SVG plots (empty: none)

	// Progress receives the progress display (nil: none). With ProgressTTY
	// it is a redrawn bar; otherwise a line every ProgressEvery (default 5 s).
	Progress      io.Writer
	ProgressTTY   bool
	ProgressEvery time.Duration
	// Log receives warnings such as malformed trace lines (nil: Progress).
	Log io.Writer

	// Client overrides the HTTP client (tests); by default RunLoad builds
	// one sized for the load and closes its idle connections at the end.
	Client *http.Client
}

func (c *LoadConfig) defaults() error {
	if c.Endpoint == "" {
		c.Endpoint = "chat"
	}
	if c.Endpoint != "chat" && c.Endpoint != "completions" {
		return fmt.Errorf("--endpoint must be chat or completions, not %q", c.Endpoint)
	}
	if c.URL == "" {
		return errors.New("--url is required")
	}
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("--url %q is not an http(s) URL", c.URL)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1"
	}
	c.URL = strings.TrimRight(u.String(), "/")
	if (c.TracePath == "") == (c.Synthetic == nil) {
		return errors.New("give exactly one workload: --trace PATH or --synthetic")
	}
	if c.Synthetic != nil {
		if err := c.Synthetic.validate(); err != nil {
			return err
		}
	}
	if c.Speedup == 0 {
		c.Speedup = 1
	}
	if !(c.Speedup > 0) {
		return fmt.Errorf("--speedup must be > 0, not %v", c.Speedup)
	}
	if c.TraceBlockSize == 0 {
		c.TraceBlockSize = tracefile.DefaultTraceBlockSize
	}
	if c.TraceBlockSize < 1 {
		return fmt.Errorf("trace block size must be > 0, not %d", c.TraceBlockSize)
	}
	switch {
	case c.Concurrency < 0 || c.Rate < 0 || c.Requests < 0 || c.MaxInFlight < 0:
		return errors.New("--concurrency, --rate, --requests and the in-flight cap must not be negative")
	case c.Concurrency > 0 && c.Rate > 0:
		return errors.New("give --concurrency (closed loop) or --rate (open loop), not both")
	case c.Synthetic != nil && c.Concurrency == 0 && c.Rate == 0:
		return errors.New("a synthetic workload has no timestamps: give --concurrency or --rate")
	case c.Timeout < 0 || c.Duration < 0 || c.Grace < 0:
		return errors.New("--timeout, --duration and --grace must not be negative")
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 4096
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Minute
	}
	if c.Grace == 0 {
		c.Grace = 5 * time.Second
	}
	if c.ProgressEvery <= 0 {
		c.ProgressEvery = 5 * time.Second
	}
	if c.Log == nil {
		c.Log = c.Progress
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	return nil
}

func (c *LoadConfig) schedule() string {
	switch {
	case c.Concurrency > 0:
		return fmt.Sprintf("closed loop, concurrency %d", c.Concurrency)
	case c.Rate > 0:
		return fmt.Sprintf("open loop, Poisson %.3g req/s (seed %d)", c.Rate, c.Seed)
	}
	return fmt.Sprintf("open loop, trace timestamps ÷ %.3g", c.Speedup)
}

// Error kinds besides "http_<status>".
const (
	ErrTimeout           = "timeout"
	ErrConnectionRefused = "connection_refused"
	ErrConnection        = "connection_error"
	ErrStream            = "stream_error"
	ErrEmpty             = "empty_response"
	ErrCanceled          = "canceled"
	ErrRequest           = "request_error" // the request could not be built
)

// RequestRecord is one sent request. Times are from the run start; metric
// fields are meaningful only when OK (ITL also needs 2+ output tokens).
type RequestRecord struct {
	Index        int     `json:"index"`
	TraceLine    int     `json:"trace_line,omitempty"`
	Group        int     `json:"group,omitempty"`
	StartS       float64 `json:"start_s"`
	LagMS        float64 `json:"schedule_lag_ms,omitempty"`
	InputTokens  int     `json:"input_tokens"`
	MaxTokens    int     `json:"max_tokens"`
	PromptTokens int     `json:"prompt_tokens,omitempty"` // from usage
	CachedTokens int     `json:"cached_tokens,omitempty"` // usage.prompt_tokens_details.cached_tokens
	OutputTokens int     `json:"output_tokens"`
	OK           bool    `json:"ok"`
	Status       int     `json:"status,omitempty"`
	Error        string  `json:"error,omitempty"`
	Detail       string  `json:"detail,omitempty"`
	TTFTms       float64 `json:"ttft_ms,omitempty"`
	TTSTms       float64 `json:"ttst_ms,omitempty"`
	HasTTST      bool    `json:"-"`
	ITLms        float64 `json:"itl_ms,omitempty"`
	HasITL       bool    `json:"-"`
	LatencyMS    float64 `json:"latency_ms,omitempty"`
	EndS         float64 `json:"end_s"`
	Good         bool    `json:"good"`
}

type loadRunner struct {
	c       *LoadConfig
	client  *http.Client
	url     string
	start   time.Time
	hard    context.Context // cancelled a grace period after sending stops
	items   []loadItem
	recs    []RequestRecord
	sent    []bool
	nSent   atomic.Int64
	nDone   atomic.Int64
	nFailed atomic.Int64
}

// RunLoad runs the load, writes the outputs to c.OutDir and a summary to
// stdout (its last line starts with "load:"), and returns the report. When
// ctx is cancelled it stops sending, gives in-flight requests c.Grace to
// finish, and still reports and writes what was measured (Interrupted set,
// nil error).
func RunLoad(ctx context.Context, c LoadConfig, stdout io.Writer) (*LoadReport, error) {
	if err := c.defaults(); err != nil {
		return nil, fmt.Errorf("bench load: %w", err)
	}
	items, traceErrs, err := loadWorkload(&c)
	if err != nil {
		return nil, fmt.Errorf("bench load: %w", err)
	}
	client := c.Client
	if client == nil {
		tr := &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			DialContext:         (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: max(c.Concurrency, 64),
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		}
		defer tr.CloseIdleConnections()
		client = &http.Client{Transport: tr}
	}
	if c.Model == "" {
		m, err := firstModel(ctx, client, c.URL, c.APIKey, min(c.Timeout, 30*time.Second))
		if err != nil {
			return nil, fmt.Errorf("bench load: no --model given and %w", err)
		}
		c.Model = m
	}
	path := "/chat/completions"
	if c.Endpoint == "completions" {
		path = "/completions"
	}
	r := &loadRunner{c: &c, client: client, url: c.URL + path, items: items,
		recs: make([]RequestRecord, len(items)), sent: make([]bool, len(items))}
	// A kvmesh server's per-stage breakdown: its histogram before and after.
	before, stagesErr := scrapeStages(ctx, client, &c)
	interrupted := r.run(ctx)
	var recs []RequestRecord
	for i := range r.recs {
		if r.sent[i] {
			recs = append(recs, r.recs[i])
		}
	}
	rep := buildReport(&c, recs, len(items))
	if stagesErr == nil {
		if after, err := scrapeStages(context.WithoutCancel(ctx), client, &c); err == nil {
			rep.Stages = stageRows(after.Since(before))
		}
	}
	rep.TraceErrors = traceErrs
	rep.Interrupted = interrupted
	if c.OutDir != "" {
		if err := rep.writeOutputs(c.OutDir, recs); err != nil {
			rep.printSummary(stdout)
			return rep, fmt.Errorf("bench load: %w", err)
		}
	}
	rep.printSummary(stdout)
	return rep, nil
}

// loadWorkload builds the items, capped at c.Requests, and reports
// malformed trace lines to c.Log.
func loadWorkload(c *LoadConfig) ([]loadItem, int, error) {
	var items []loadItem
	nErrs := 0
	if c.Synthetic != nil {
		items = syntheticItems(*c.Synthetic, c.TraceBlockSize, c.Seed)
	} else {
		reqs, errs, err := tracefile.Load(c.TracePath, tracefile.Options{Strict: c.Strict, TraceBlockSize: c.TraceBlockSize})
		if err != nil {
			return nil, 0, err
		}
		nErrs = len(errs)
		for i, e := range errs {
			if i == 10 {
				fmt.Fprintf(c.Log, "trace: ... and %d more malformed lines skipped\n", len(errs)-i)
				break
			}
			fmt.Fprintf(c.Log, "trace: %s: line %d skipped: %v\n", c.TracePath, e.Line, e.Err)
		}
		if len(reqs) == 0 {
			return nil, nErrs, fmt.Errorf("trace %s holds no valid request", c.TracePath)
		}
		items = traceItems(reqs, c.TraceBlockSize, c.Speedup)
	}
	if c.Requests > 0 && len(items) > c.Requests {
		items = items[:c.Requests]
	}
	if c.Salt != 0 {
		// A xor with one value per salt keeps distinct ids distinct.
		mix := mix.Mix64(c.Salt * mix.Golden)
		for i := range items {
			for j := range items[i].segs {
				items[i].segs[j].ID ^= mix
			}
		}
	}
	if c.Rate > 0 {
		poissonTimes(items, c.Rate, c.Seed)
	}
	return items, nErrs, nil
}

// run sends the workload and returns a non-empty reason when it stopped
// early (cancellation or the overall deadline).
func (r *loadRunner) run(ctx context.Context) string {
	sendCtx, cancelSend := context.WithCancel(ctx)
	defer cancelSend()
	if r.c.Duration > 0 {
		var cancel context.CancelFunc
		sendCtx, cancel = context.WithTimeout(sendCtx, r.c.Duration)
		defer cancel()
	}
	hard, cancelHard := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHard()
	r.hard = hard
	finished := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		// Once sending stops early, in-flight requests get the grace period.
		select {
		case <-finished:
			return
		case <-sendCtx.Done():
		}
		t := time.NewTimer(r.c.Grace)
		defer t.Stop()
		select {
		case <-finished:
		case <-t.C:
			cancelHard()
		}
	})
	r.start = time.Now()
	stopProgress := r.startProgress(&wg, finished)
	if r.c.Concurrency > 0 {
		r.closedLoop(sendCtx)
	} else {
		r.openLoop(sendCtx)
	}
	close(finished)
	stopProgress()
	wg.Wait()
	reason := ""
	switch {
	case ctx.Err() != nil:
		reason = "cancelled"
	case sendCtx.Err() != nil:
		reason = fmt.Sprintf("deadline of %v reached", r.c.Duration)
	}
	if reason != "" && r.nSent.Load() == int64(len(r.items)) {
		// Everything was sent and finished before the stop took effect.
		stopped := false
		for i := range r.recs {
			stopped = stopped || r.recs[i].Error == ErrCanceled
		}
		if !stopped {
			reason = ""
		}
	}
	return reason
}

func (r *loadRunner) closedLoop(ctx context.Context) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < min(r.c.Concurrency, len(r.items)); w++ {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= len(r.items) {
					return
				}
				r.send(i, 0)
			}
		})
	}
	wg.Wait()
}

func (r *loadRunner) openLoop(ctx context.Context) {
	sem := make(chan struct{}, r.c.MaxInFlight)
	var wg sync.WaitGroup
	defer wg.Wait()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for i := range r.items {
		at := r.start.Add(time.Duration(r.items[i].atMS * float64(time.Millisecond)))
		if d := time.Until(at); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		}
		select {
		case <-ctx.Done():
			return
		case sem <- struct{}{}:
		}
		if ctx.Err() != nil {
			<-sem
			return
		}
		lag := time.Since(at)
		wg.Go(func() {
			defer func() { <-sem }()
			r.send(i, lag)
		})
	}
}

// send runs request i and fills its record.
func (r *loadRunner) send(i int, lag time.Duration) {
	it := &r.items[i]
	rec := &r.recs[i]
	r.sent[i] = true
	r.nSent.Add(1)
	*rec = RequestRecord{Index: i, TraceLine: it.traceLine, Group: max(it.group, 0), InputTokens: it.inputTokens, MaxTokens: it.outputTokens}
	if lag > 0 {
		rec.LagMS = ms(lag)
	}
	body, err := r.body(it)
	if err != nil {
		rec.Error, rec.Detail = ErrRequest, err.Error()
		r.nFailed.Add(1)
		r.nDone.Add(1)
		return
	}
	// start precedes the timeout's clock, so a timed-out request's
	// recorded duration is never below the timeout.
	start := time.Now()
	ctx, cancel := context.WithTimeout(r.hard, r.c.Timeout)
	defer cancel()
	rec.StartS = start.Sub(r.start).Seconds()
	res := doStream(ctx, r.client, r.url, r.c.APIKey, body)
	end := time.Now()
	rec.EndS = end.Sub(r.start).Seconds()
	rec.Status = res.status
	if res.err != "" {
		rec.Error, rec.Detail = res.err, res.detail
		if r.hard.Err() != nil && (res.err == ErrTimeout || res.err == ErrConnection || res.err == ErrStream) {
			rec.Error = ErrCanceled
		}
		r.nFailed.Add(1)
		r.nDone.Add(1)
		return
	}
	rec.OK = true
	rec.PromptTokens, rec.CachedTokens = res.promptTokens, res.cachedTokens
	rec.OutputTokens = res.outputTokens
	rec.TTFTms = ms(res.first.Sub(start))
	rec.LatencyMS = ms(res.last.Sub(start))
	if !res.second.IsZero() {
		rec.HasTTST = true
		rec.TTSTms = ms(res.second.Sub(res.first))
	}
	if rec.OutputTokens > 1 {
		rec.HasITL = true
		rec.ITLms = (rec.LatencyMS - rec.TTFTms) / float64(rec.OutputTokens-1)
	}
	r.nDone.Add(1)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type loadBody struct {
	Model         string        `json:"model"`
	Messages      []chatMessage `json:"messages,omitempty"`
	Prompt        string        `json:"prompt,omitempty"`
	MaxTokens     int           `json:"max_tokens"`
	MinTokens     int           `json:"min_tokens,omitempty"`
	IgnoreEOS     bool          `json:"ignore_eos,omitempty"`
	Stream        bool          `json:"stream"`
	StreamOptions streamOptions `json:"stream_options"`
}

func (r *loadRunner) body(it *loadItem) ([]byte, error) {
	text := promptText(it.segs)
	b := loadBody{Model: r.c.Model, MaxTokens: it.outputTokens, Stream: true, StreamOptions: streamOptions{IncludeUsage: true}}
	if r.c.Endpoint == "completions" {
		b.Prompt = text
	} else {
		b.Messages = []chatMessage{{Role: "user", Content: text}}
	}
	if r.c.IgnoreEOS {
		b.MinTokens, b.IgnoreEOS = it.outputTokens, true
	}
	return json.Marshal(b)
}

// streamResult is what one streamed request produced.
type streamResult struct {
	status                     int
	err, detail                string
	first, second, last        time.Time
	promptTokens, outputTokens int
	cachedTokens               int
}

type streamChunk struct {
	Choices []struct {
		Delta struct {
			Content          string `json:"content"`
			ReasoningContent string `json:"reasoning_content"`
			Reasoning        string `json:"reasoning"`
		} `json:"delta"`
		Text string `json:"text"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// classify names a transport error.
func classify(ctx context.Context, err error) string {
	var ne net.Error
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded):
		return ErrTimeout
	case ctx.Err() != nil:
		return ErrCanceled
	case errors.Is(err, syscall.ECONNREFUSED):
		return ErrConnectionRefused
	case errors.As(err, &ne) && ne.Timeout():
		return ErrTimeout
	}
	return ErrConnection
}

func trimDetail(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// doStream POSTs body and reads the SSE stream to [DONE].
func doStream(ctx context.Context, client *http.Client, u, key string, body []byte) (res streamResult) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return streamResult{err: ErrRequest, detail: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return streamResult{err: classify(ctx, err), detail: trimDetail(err.Error())}
	}
	defer resp.Body.Close()
	res.status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		res.err, res.detail = fmt.Sprintf("http_%d", resp.StatusCode), trimDetail(string(msg))
		return res
	}
	rd := newSSEReader(resp.Body)
	contentChunks := 0
	done := false
	for !done {
		data, err := rd.next()
		if err != nil {
			if err == io.EOF {
				res.err, res.detail = ErrStream, "stream ended before [DONE]"
			} else if ctx.Err() != nil {
				res.err, res.detail = classify(ctx, err), trimDetail(err.Error())
			} else {
				res.err, res.detail = ErrStream, trimDetail(err.Error())
			}
			return res
		}
		if string(data) == "[DONE]" {
			done = true
			break
		}
		now := time.Now()
		var ch streamChunk
		if err := json.Unmarshal(data, &ch); err != nil {
			res.err, res.detail = ErrStream, trimDetail("bad chunk: "+err.Error())
			return res
		}
		if len(ch.Error) > 0 && string(ch.Error) != "null" {
			res.err, res.detail = ErrStream, trimDetail(string(ch.Error))
			return res
		}
		res.last = now
		for _, c := range ch.Choices {
			if c.Delta.Content != "" || c.Delta.ReasoningContent != "" || c.Delta.Reasoning != "" || c.Text != "" {
				contentChunks++
				if res.first.IsZero() {
					res.first = now
				} else if res.second.IsZero() {
					res.second = now
				}
				break
			}
		}
		if ch.Usage != nil {
			res.promptTokens, res.outputTokens = ch.Usage.PromptTokens, ch.Usage.CompletionTokens
			if d := ch.Usage.PromptTokensDetails; d != nil {
				res.cachedTokens = d.CachedTokens
			}
		}
	}
	if res.first.IsZero() {
		res.err, res.detail = ErrEmpty, "no token in the stream"
		return res
	}
	if res.outputTokens == 0 {
		// No usage chunk: one token per content chunk.
		res.outputTokens = contentChunks
	}
	return res
}

// sseReader yields the data payload of each server-sent event.
type sseReader struct {
	r   *bytes.Buffer
	src io.Reader
	buf []byte
	eof bool
}

func newSSEReader(src io.Reader) *sseReader {
	return &sseReader{r: &bytes.Buffer{}, src: src, buf: make([]byte, 32<<10)}
}

const maxSSELine = 16 << 20

// line returns the next line without its terminator.
func (s *sseReader) line() ([]byte, error) {
	for {
		if i := bytes.IndexByte(s.r.Bytes(), '\n'); i >= 0 {
			l := s.r.Next(i + 1)
			return bytes.TrimRight(l[:i], "\r"), nil
		}
		if s.eof {
			if s.r.Len() > 0 {
				return s.r.Next(s.r.Len()), nil
			}
			return nil, io.EOF
		}
		if s.r.Len() > maxSSELine {
			return nil, fmt.Errorf("SSE line longer than %d bytes", maxSSELine)
		}
		n, err := s.src.Read(s.buf)
		s.r.Write(s.buf[:n])
		if err == io.EOF {
			s.eof = true
		} else if err != nil {
			return nil, err
		}
	}
}

// next returns the data of the next event (multi-line data joined by
// newlines); comments and other fields are skipped.
func (s *sseReader) next() ([]byte, error) {
	var data []byte
	have := false
	for {
		l, err := s.line()
		if err != nil {
			if err == io.EOF && have {
				return data, nil
			}
			return nil, err
		}
		if len(l) == 0 {
			if have {
				return data, nil
			}
			continue
		}
		if l[0] == ':' {
			continue
		}
		field, val, _ := bytes.Cut(l, []byte(":"))
		if string(field) != "data" {
			continue
		}
		val = bytes.TrimPrefix(val, []byte(" "))
		if have {
			data = append(data, '\n')
		}
		data = append(data, val...)
		have = true
	}
}

// firstModel asks GET /models for the first model id.
func firstModel(ctx context.Context, client *http.Client, base, key string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/models", nil)
	if err != nil {
		return "", err
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("GET %s/models failed (%s): %w", base, classify(ctx, err), err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return "", fmt.Errorf("GET %s/models: %w", base, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s/models: HTTP %d: %s", base, resp.StatusCode, trimDetail(string(b)))
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		return "", fmt.Errorf("GET %s/models: %w", base, err)
	}
	if len(list.Data) == 0 || list.Data[0].ID == "" {
		return "", fmt.Errorf("GET %s/models lists no model", base)
	}
	return list.Data[0].ID, nil
}
