package main

import (
	"sync"

	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/tokenizer"
)

// simOutputTokens is the sim's output vocabulary in serve and worker: plain
// English words of the built-in tokenizer the frontend decodes with, so a
// demo's answers read as words, never as random (sometimes crude) pieces.
// Nil (the whole vocabulary) if the tokenizer cannot load.
var simOutputTokens = sync.OnceValue(func() []kv.Token {
	tok, _, err := tokenizer.Builtin()
	if err != nil {
		return nil
	}
	return tokenizer.PlainWordTokens(tok)
})
