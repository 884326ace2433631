#!/usr/bin/env bash
# vllm-tiny-model.sh DIR: writes a tiny Llama-shaped model to DIR for
# `vllm serve DIR --load-format dummy` (random weights: nothing is
# downloaded). Its tokenizer is the repo's tokenizer/testdata/tiny (a 274-id
# byte-level BPE with ChatML markers), the one kvmesh's frontend loads with
# `--tokenizer DIR`, so vLLM and kvmesh tokenize alike.
#
# Sized to run on two CPU cores: 2 layers, hidden 256, float32.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
dir=$1
src=$(cd "$(dirname "$0")/.." && pwd)/tokenizer/testdata/tiny
mkdir -p "$dir"
cp "$src/tokenizer.json" "$dir/tokenizer.json"
# transformers picks a model-specific tokenizer class from config.json's
# model_type unless tokenizer_config.json names the generic one, which
# keeps tokenizer.json's own pre-tokenizer and decoder.
sed 's/^{$/{\n "tokenizer_class": "PreTrainedTokenizerFast",/' "$src/tokenizer_config.json" >"$dir/tokenizer_config.json"
vocab=$(grep -o '"id": [0-9]*' "$src/tokenizer.json" | awk '{print $2}' | sort -n | tail -1)
vocab=$((vocab + 1))
cat >"$dir/config.json" <<EOF
{
 "architectures": ["LlamaForCausalLM"],
 "model_type": "llama",
 "hidden_size": 256,
 "intermediate_size": 512,
 "num_hidden_layers": 2,
 "num_attention_heads": 4,
 "num_key_value_heads": 4,
 "head_dim": 64,
 "hidden_act": "silu",
 "vocab_size": $vocab,
 "max_position_embeddings": 2048,
 "rms_norm_eps": 1e-06,
 "rope_theta": 10000.0,
 "tie_word_embeddings": false,
 "torch_dtype": "float32",
 "bos_token_id": 270,
 "eos_token_id": 272,
 "pad_token_id": 270
}
EOF
echo "$dir"
