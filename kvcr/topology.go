package kvcr

import (
	"fmt"
	"strings"
)

// Topology is an engine's parallel layout as far as linker inventory
// cares. Zero counts mean 1.
type Topology struct {
	TP, DP, PP int
	// CP is context parallel (SGLang's attention context parallel), DCP
	// decode context parallel.
	CP, DCP int
	// AttentionDP is SGLang's --enable-dp-attention.
	AttentionDP      bool
	NNodes           int
	TokenizerWorkers int
}

// Gate refuses a topology linker inventory does not support, in one line
// naming source (where the topology was read) and every reason. SGLang
// publishes linker inventory at TP 1 only, and the inventory carries no
// rank, stage or node: anything that splits a block's KV or the engine's
// requests across processes cannot be described by it.
func (t Topology) Gate(source string) error {
	var why []string
	add := func(n int, format string) {
		if n > 1 {
			why = append(why, fmt.Sprintf(format, n))
		}
	}
	add(t.TP, "tensor parallel %d (linker inventory is published at TP 1 only)")
	add(t.DP, "data parallel %d (the inventory carries no DP rank)")
	if t.AttentionDP {
		why = append(why, "attention data parallel (ranks bind control ports the inventory does not name)")
	}
	add(t.CP, "context parallel %d (each rank holds part of a block's KV)")
	add(t.DCP, "decode context parallel %d (each rank holds part of a block's KV)")
	add(t.PP, "pipeline parallel %d (each stage holds only its layers' KV)")
	add(t.NNodes, "%d nodes (one host's endpoint cannot serve a multi-node engine's blocks)")
	add(t.TokenizerWorkers, "%d tokenizer workers (hints would reach only one of them)")
	if len(why) == 0 {
		return nil
	}
	return fmt.Errorf("--kvcr-inventory: unsupported engine topology (%s): %s", source, strings.Join(why, "; "))
}
