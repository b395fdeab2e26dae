#!/bin/bash
# The 16-bit predictions at the MoE and OLMo-Hybrid releases (docs/quantization.md, "The 16-bit
# gates' noise floor"): the 2-core development machine, both presets at once under the heavy
# lock, one thread each, from the repository root.
export OMP_NUM_THREADS=1
HERE=$(dirname "$0")
for P in lfm2-8b-a1b olmo-hybrid-7b; do
  /usr/bin/time -v python benchmarks/fp16_gate_floor.py $P --recipes fp16 int8keepproj --json "$HERE/$P.json" > "$HERE/$P.log" 2>&1 &
done
wait
