"""What a decode call pays when the bundle's lowered files are not in the page cache.

The runtime keeps a constant read by row lookup (the embedding table; an expert stack
gathered or branched into) mapped from the lowered files, so a row that was never read pays a
read from disk once the pages are evicted. Per round, the files are either evicted
(posix_fadvise DONTNEED: pages the process has already touched stay) or read back
(`Runner.page_in`), then 6 new random tokens are decoded, each profiled: its first `gather_nd`
(the embedding row) and the whole call, in ms.

    flock /tmp/ssmport-heavy.lock env PYTHONPATH=$PWD python benchmarks/page_cache.py BUNDLE [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from profile_ops import per_call, recorder  # noqa: E402

from ssmport.bundle import Bundle  # noqa: E402
from ssmport.runtime import Runner, lowered_path  # noqa: E402
from ssmport.runtime.op_count import CALL_EVENT  # noqa: E402

TOKENS = 6


def evict(entry: Path) -> None:
    for path in sorted(p for p in entry.rglob("*") if p.is_file()):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle", type=Path)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    bundle = Bundle.open(a.bundle)
    profiler, intervals = recorder()
    rng = np.random.default_rng(7)
    with Runner(bundle, profiler=profiler) as runner:
        entry = lowered_path(bundle)
        for _ in range(a.rounds):
            for how in ("evicted", "paged in"):
                evict(entry) if how == "evicted" else runner.page_in()
                lookups, calls = [], []
                for token in rng.integers(0, runner.vocab_size, TOKENS).tolist():
                    intervals.clear()
                    runner.step(int(token))
                    ops = per_call(intervals + [(CALL_EVENT, 0)])[0]
                    lookups.append(next(ns for name, ns in ops if "gather_nd" in name) / 1e6)
                    calls.append(sum(ns for _, ns in ops) / 1e6)
                print(f"{how:9} first gather_nd ms {[round(x, 3) for x in lookups]}  call ms {[round(x, 1) for x in calls]}", flush=True)


if __name__ == "__main__":
    main()
