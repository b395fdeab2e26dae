cd /work/main; export PYTHONPATH=$PWD SSMPORT_CACHE=/tmp/cache-lfm3here; S="/work/venv/bin/python -m ssmport.cli.main"; R=/tmp/lfm3here
{
 echo "start $(date -u +%T)"; t0=$(date +%s)
 $S export lfm3-1.7b --synthetic --quant int4keepproj --no-gate -o /tmp/g3 --name lfm3-1.7b-int4keepproj --overwrite; echo "export rc=$? $(( $(date +%s) - t0 )) s"
 /work/venv/bin/python -c "import json; m=json.load(open('/tmp/g3/lfm3-1.7b-int4keepproj/manifest.json')); print('asset_bytes', m['asset']['bytes'])"
 t1=$(date +%s)
 $S gate /tmp/g3/lfm3-1.7b-int4keepproj --decode-only --prompts 1 --steps 8 --json > $R/lfm3-1.7b-int4keepproj.json; echo "gate rc=$? $(( $(date +%s) - t1 )) s"
 rm -rf /tmp/g3 /tmp/cache-lfm3here; echo "end $(date -u +%T)"
} > $R/lfm3-1.7b-int4keepproj.log 2>&1
