#!/bin/bash
cd /tmp && rm -rf /tmp/mission && mkdir -p /tmp/mission
export SSMPORT_CACHE=/tmp/mission/cache
date -u
/usr/bin/time -v env PYTHONPATH=/work/main /work/venv/bin/python -m ssmport.cli.main export rwkv7-1.5b --synthetic --quant int8keepproj -o /tmp/mission/out > /tmp/mission/stdout.txt 2> /tmp/mission/stderr.txt
echo "rc=$?"
date -u
