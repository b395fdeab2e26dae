#!/bin/bash
# Gates at the smallest released size of each family (two 1.6-1.7B ones at int4keepproj only), every
# recipe, synthetic weights: run on the GPU machine's 16 CPU cores (the same Linux Core AI runtime),
# 15 jobs at a time, one thread each, 2026-12-06 (H100 machine, 3 calls, 1,692 s of device time).
# Each job: export without a gate, then the export's default gate for a 16-bit bundle since that
# day (1 stream, 8 tokens, every token through `main`), as `ssmport gate --decode-only`.
# Then: python summarize.py  (the table in docs/quantization.md)
set -u
R=${R:-results}; mkdir -p $R
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
one() {
  P=$1; Q=$2; N=$P-$Q; export SSMPORT_CACHE=/tmp/cache-$N
  {
    echo "start $(date -u +%T)"; t0=$(date +%s)
    ssmport export $P --synthetic --quant $Q --no-gate -o /tmp/g --name $N --overwrite; echo "export rc=$? $(( $(date +%s) - t0 )) s"
    python3 -c "import json; m=json.load(open('/tmp/g/$N/manifest.json')); print('asset_bytes', m['asset']['bytes'])"
    t1=$(date +%s)
    ssmport gate /tmp/g/$N --decode-only --prompts 1 --steps 8 --json > $R/$N.json; echo "gate rc=$? $(( $(date +%s) - t1 )) s"
    rm -rf /tmp/g/$N /tmp/cache-$N; echo "end $(date -u +%T)"
  } > $R/$N.log 2>&1
}
export -f one; export R
PRESETS="qwen3.5-0.8b falcon-h1-0.5b-base granite-4.0-h-350m lfm2-350m gated-deltanet-340m mamba-130m mamba2-130m rwkv7-0.1b"
jobs() {  # JOBS="preset recipe" lines, or every job of that day
  if [ -n "${JOBS:-}" ]; then echo "$JOBS"; return; fi
  for P in rwkv6-1.6b lfm3-1.7b; do echo "$P int4keepproj"; done
  for P in $PRESETS; do
    for Q in int8keepproj int4keepproj int4 fp16; do echo "$P $Q"; done
  done
  for P in $PRESETS; do echo "$P fp32"; done
}
jobs | xargs -P ${PARALLEL:-15} -L 1 bash -c 'one "$0" "$1"'
