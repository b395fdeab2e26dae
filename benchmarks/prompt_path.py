"""Which way a bundle's prompts are faster on this runtime, and which way a Runner takes them
(ssmport.runtime.prompt_path): the prefill chunks against `main` one token a call, alternated in
one process (prefill_speed.measure, which also checks the two agree), from a zero state.

    flock /tmp/ssmport-heavy.lock env PYTHONPATH=$PWD python benchmarks/prompt_path.py BUNDLE [--prompts 64 512]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from prefill_speed import measure  # noqa: E402

from ssmport.bundle import Bundle  # noqa: E402
from ssmport.runtime.prompt_path import largest_expert_matrix, prompts_through_prefill  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--prompts", nargs="+", type=int, default=[64])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, help="results JSON")
    a = ap.parse_args()
    m = Bundle.open(a.bundle).manifest
    chunks, largest = prompts_through_prefill(m), largest_expert_matrix(m)
    print(f"{a.bundle}: experts {m.export.get('experts', 'gathered')}, largest expert matrix "
          f"{largest:,} parameters; a Runner feeds prompts through "
          f"{'prefill chunks' if chunks else 'main, one token a call'}", flush=True)  # fmt: skip
    runs, _ = measure(a.bundle, a.prompts, a.repeats, seed=0)
    for run in runs:
        faster = run["speedup"] > 1
        run["runner_takes_the_faster"] = faster == chunks
        print(f"  prompt {run['prompt_tokens']}: the Runner's way is the "
              f"{'faster' if run['runner_takes_the_faster'] else 'SLOWER'}", flush=True)  # fmt: skip
    if a.out:
        a.out.write_text(json.dumps({"bundle": str(a.bundle), "prompts_through_prefill": chunks,
                                     "largest_expert_matrix": largest, "runs": runs}, indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
