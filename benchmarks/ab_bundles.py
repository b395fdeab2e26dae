"""Decode ms/token of two bundles on the Core AI runtime, alternated in one process: 4 rounds of 12
timed tokens (after 2) each, which bundle goes first alternating, so drift in the machine's load
falls on both. Prints each round's median and, last, a JSON line of the medians.

    flock /tmp/ssmport-heavy.lock env PYTHONPATH=$PWD python benchmarks/ab_bundles.py BUNDLE_A BUNDLE_B
"""

import sys, json, numpy as np
sys.path.insert(0, "benchmarks")
import suite
from ssmport.bundle import Bundle
bundles = [Bundle.open(p) for p in sys.argv[1:3]]
tokens = suite.bench_tokens(bundles[0].manifest.vocab_size, 14)
# keyed by path: two builds of one model share the bundle's name
res = {f"{b.path}:" + b.manifest.export.get("experts", "gathered"): [] for b in bundles}
keys = list(res)
for r in range(4):
    order = [0, 1] if r % 2 == 0 else [1, 0]
    for i in order:
        res[keys[i]].append(float(np.median(suite.coreai_line(bundles[i], tokens, 2))))
        print(r, keys[i], round(res[keys[i]][-1], 1), flush=True)
print(json.dumps({k: {"round_medians_ms": [round(x, 1) for x in v], "median_ms": round(float(np.median(v)), 1)} for k, v in res.items()}))
