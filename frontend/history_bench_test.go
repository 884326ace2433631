package frontend

import (
	"strconv"
	"strings"
	"testing"
)

// BenchmarkChatHistory is what a long chat body's bytes cost the
// frontend before tokenizing, the part every turn pays over its whole
// history: the body parsed (messages and contents read), and the messages
// rendered by the built-in template. A 16-turn body (~60 KB, 31
// messages, plain prose); MB/s gives the cost per KB.
//
//	go test ./frontend -run '^$' -bench ChatHistory -benchtime 2000x
func BenchmarkChatHistory(b *testing.B) {
	var msgs []string
	for turn := range 16 {
		var sb strings.Builder
		for i := range 90 {
			sb.WriteString("answer " + strconv.Itoa(turn*1000+i) + " is " + strconv.Itoa(i*7) + ", ")
		}
		msgs = append(msgs, `{"role":"user","content":"`+sb.String()+`"}`, `{"role":"assistant","content":"`+sb.String()+`"}`)
	}
	body := []byte(`{"model":"m","stream":true,"max_tokens":1,"messages":[` + strings.Join(msgs[:31], ",") + `]}`)
	b.Run("parse", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if _, err := parseChat(body); err != nil {
				b.Fatal(err)
			}
		}
	})
	req, aerr := parseChat(body)
	if aerr != nil {
		b.Fatal(aerr)
	}
	m, err := BuiltinModel("m")
	if err != nil {
		b.Fatal(err)
	}
	b.Run("template", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if _, _, err := m.RenderChat(req.Messages, 1<<20); err != nil {
				b.Fatal(err)
			}
		}
	})
}
