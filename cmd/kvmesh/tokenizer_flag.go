package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvmesh/kvmesh/frontend"
	"github.com/kvmesh/kvmesh/tokenizer"
)

// loadModel is the served model name with --tokenizer's Hugging Face
// tokenizer (path: tokenizer.json or its directory; the chat template and
// eos token from tokenizer_config.json beside it), or the built-in o200k
// and ChatML without one.
func loadModel(name, path string) (*frontend.Model, error) {
	if path == "" {
		return frontend.BuiltinModel(name)
	}
	file := path
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		file = filepath.Join(path, "tokenizer.json")
	}
	config := filepath.Join(filepath.Dir(file), "tokenizer_config.json")
	if _, err := os.Stat(config); err != nil {
		return nil, fmt.Errorf("--tokenizer %s: the chat template comes from tokenizer_config.json beside it: %w", path, err)
	}
	tok, tmpl, err := tokenizer.LoadHF(file, config)
	if err != nil {
		return nil, fmt.Errorf("--tokenizer %s: %w", path, err)
	}
	eos := []string{"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "</s>"}
	if j, ok := tmpl.(*tokenizer.JinjaTemplate); ok && j.EOSToken() != "" {
		eos = append([]string{j.EOSToken()}, eos...)
	}
	m, err := frontend.NewModel(name, tok, tmpl, eos...)
	if err != nil {
		return nil, fmt.Errorf("--tokenizer %s: %w", path, err)
	}
	return m, nil
}
