#!/bin/bash
# The fp16 and int8keepproj gates of ../family_gates_device-cpu_2026-12-06 run again after the
# 16-bit floor landed (the fifth session of 2026-12-06): the same presets, streams and commands
# (that folder's run.sh), on the GPU machine's 16 CPU cores (H100 machine, 2 calls, 16 jobs at
# once, one thread each; the machine's torch was 2.11).
# Then: python summarize.py  (the table in docs/quantization.md)
HERE=$(dirname "$0")
export PARALLEL=16 JOBS=$(for P in qwen3.5-0.8b falcon-h1-0.5b-base granite-4.0-h-350m lfm2-350m gated-deltanet-340m \
                          mamba-130m mamba2-130m rwkv7-0.1b; do for Q in int8keepproj fp16; do echo "$P $Q"; done; done)
exec bash "$HERE/../family_gates_device-cpu_2026-12-06/run.sh"
