package mockengine

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// BenchmarkTRTLLMParse: the TensorRT-LLM stand-in reading a ~14k-token
// prompt as kvmesh's adapter sends it (/v1/completions, token ids) and as
// a client sends it straight (/v1/chat/completions, text it tokenizes).
//
//	go test ./mockengine -run '^$' -bench TRTLLMParse
func BenchmarkTRTLLMParse(b *testing.B) {
	sc := testSim()
	sc.Blocks = 2048
	cfg := TRTLLMConfig{Sim: sc, Logger: quiet(), MaxSeqLen: 32768}
	m, err := NewTRTLLM(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	text := strings.Repeat("The quick brown fox jumps over the lazy dog near the river bank. ", 1100)
	ids := m.tok.Encode(text)
	var p bytes.Buffer
	p.WriteString(`{"model":` + strconv.Quote(cfg.Sim.Model) + `,"prompt":[`)
	for i, t := range ids {
		if i > 0 {
			p.WriteByte(',')
		}
		p.WriteString(strconv.FormatUint(uint64(t), 10))
	}
	p.WriteString(`],"max_tokens":8,"stream":true,"stream_options":{"include_usage":true},"temperature":0,"detokenize":false}`)
	chat, _ := json.Marshal(map[string]any{"model": cfg.Sim.Model, "max_tokens": 8, "stream": true,
		"messages": []map[string]string{{"role": "user", "content": text}}})
	b.Logf("%d tokens; ids body %d bytes, chat body %d bytes", len(ids), p.Len(), len(chat))
	for _, c := range []struct {
		name string
		body []byte
		chat bool
	}{{"ids", p.Bytes(), false}, {"chat", chat, true}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				r := httptest.NewRequest("POST", "/v1/completions", bytes.NewReader(c.body))
				if j, _, msg := m.parse(r, c.chat); j == nil {
					b.Fatal(msg)
				}
			}
		})
	}
}
