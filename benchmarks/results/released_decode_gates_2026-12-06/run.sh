#!/bin/bash
# Released-size decode-only gates (synthetic weights): export --no-gate, then gate --decode-only, 1 stream of 8.
cd /work/main
export PYTHONPATH=/work/main
S="/work/venv/bin/python -m ssmport.cli.main"
for mq in "lfm2-1.2b int4keepproj" "gated-deltanet-1.3b int4keepproj" "mamba2-1.3b int4keepproj"; do
  set -- $mq; m=$1; q=$2; tag=$m-$q
  rm -rf /tmp/rs/out; export SSMPORT_CACHE=/tmp/rs/cache
  echo "== $tag $(date -u +%T)"
  /usr/bin/time -f "export wall %e s maxrss %M KB" $S export $m --synthetic --quant $q --no-gate -o /tmp/rs/out > /tmp/rs/$tag.export.out 2> /tmp/rs/$tag.export.err
  echo "export rc=$?"; tail -1 /tmp/rs/$tag.export.err; grep "^asset" /tmp/rs/$tag.export.out
  /usr/bin/time -f "gate wall %e s maxrss %M KB" $S gate /tmp/rs/out/$tag --decode-only --prompts 1 --steps 8 --json > /tmp/rs/$tag.gate.json 2> /tmp/rs/$tag.gate.err
  echo "gate rc=$?"; tail -1 /tmp/rs/$tag.gate.err
  rm -rf /tmp/rs/out /tmp/rs/cache
done
echo "== end $(date -u +%T)"
