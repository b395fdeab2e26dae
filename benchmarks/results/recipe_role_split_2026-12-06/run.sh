#!/bin/bash
# The role splits of docs/quantization.md (the mission command's int8keepproj, and the
# int4keepproj FAILs of the family table), one after another on the 2-core development
# machine under the heavy lock, from the repository root.
HERE=$(dirname "$0")
j() { /usr/bin/time -v python benchmarks/recipe_role_split.py $1 $2 --roles $3 --json "$HERE/$1-$2.json" > "$HERE/$1-$2.log" 2>&1; }
j rwkv7-1.5b int8keepproj "head ffn"
j gated-deltanet-340m int4keepproj "ffn attn_proj head out_proj"
j lfm2-350m int4keepproj "ffn attn_proj head out_proj"
j qwen3.5-0.8b int4keepproj "ffn attn_proj head out_proj"
j lfm3-1.7b int4keepproj "ffn attn_proj head out_proj"
j rwkv6-1.6b int4keepproj "ffn head out_proj"
