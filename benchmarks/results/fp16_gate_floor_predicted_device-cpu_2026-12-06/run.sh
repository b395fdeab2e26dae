#!/bin/bash
# The int8keepproj predictions of docs/quantization.md ("The 16-bit gates' noise floor") run
# again after the layer-streamed reference's fix (3556a78): the GPU machine's 16 CPU cores,
# 3 jobs at once, one thread each (its torch was 2.11), from the repository root.
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
HERE=$(dirname "$0")
for P in rwkv7-2.9b recurrentgemma-2b nemotron-h-4b; do
  /usr/bin/time -v python3 benchmarks/fp16_gate_floor.py $P --recipes fp16 int8keepproj --json "$HERE/$P.json" > "$HERE/$P.log" 2>&1 &
done
wait
