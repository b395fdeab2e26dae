"""Where a decode step's time goes on the Core AI runtime: per-op-type totals from the
runtime's `Profiler`.

    python benchmarks/profile_ops.py out/rwkv7-0.1b-fp32 --calls 8

Each op's time is the minimum over --calls profiled calls (by its position in the call,
which is the same every call), so other jobs on a shared machine inflate it less. The
profiler's callbacks cost time of their own: compare shares, and an unprofiled run's
ms/token, rather than the profiled total.
"""

from __future__ import annotations

import argparse
import collections
import json
import time

import numpy as np

from ssmport.bundle import Bundle
from ssmport.runtime import Runner
from ssmport.runtime.op_count import CALL_EVENT, op_type

def recorder():
    """(a runtime `Profiler`, the list it appends each finished event's (name, ns) to)."""
    from coreai.runtime import Profiler

    starts: dict[int, tuple[str, int]] = {}
    intervals: list[tuple[str, int]] = []

    def begin(event) -> int:
        starts[len(starts)] = (event.event_id, event.timestamp)
        return len(starts) - 1

    def end(event, interval: int) -> None:
        name, t0 = starts.pop(interval)
        intervals.append((name, event.timestamp - t0))

    return Profiler(on_log_event_begin=begin, on_log_event_end=end), intervals


def per_call(intervals: list[tuple[str, int]]) -> list[list[tuple[str, int]]]:
    """The recorded events split into calls: each call's ops (name, ns), in order."""
    calls, current = [], []
    for name, ns in intervals:
        if name == CALL_EVENT:
            calls.append(current)
            current = []
        else:
            current.append((name, ns))
    return calls


def profile(bundle: Bundle, calls: int, warmup: int = 2, function: str = "main") -> tuple[list[list[tuple[str, int]]], float]:
    """Each op's (name, ns) of `calls` calls of `function` (main: one token on running states;
    prefill: one full chunk from zero states), after `warmup` calls; and the ms per profiled call."""
    profiler, intervals = recorder()
    rng = np.random.default_rng(0)
    with Runner(bundle, prefill=True, profiler=profiler) as runner:  # prefill even where prompts skip it
        runner.page_in()  # as the timed lines do (ssmport.bench)
        if function == "main":
            call = lambda: runner.step(int(rng.integers(1, runner.vocab_size)))  # noqa: E731
        elif runner.has_prefill and runner.layout.name == "ssmport":

            def call() -> None:
                runner.reset()
                runner.feed(rng.integers(1, runner.vocab_size, runner.prefill_chunk).tolist())
        else:
            raise SystemExit(f"{bundle.path}: no ssmport-layout prefill function to profile")
        for _ in range(warmup):
            call()
        intervals.clear()
        start = time.perf_counter()
        for _ in range(calls):
            call()
        profiled_ms = 1000 * (time.perf_counter() - start) / calls
    return per_call(intervals), profiled_ms

def by_op_type(per_call: list[list[tuple[str, int]]]) -> dict[str, dict]:
    n = min(len(c) for c in per_call)
    totals: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    for i in range(n):
        name = op_type(per_call[0][i][0])
        totals[name] += min(c[i][1] for c in per_call)
        counts[name] += 1
    whole = sum(totals.values())
    return {k: {"ms": v / 1e6, "share": v / whole, "ops": counts[k]} for k, v in totals.most_common()}

def per_op(per_call: list[list[tuple[str, int]]]) -> list[dict]:
    """Every op of the call in order, by its position (the same op every call: the last matmul
    of a decode call is the LM head), with its minimum over the calls."""
    n = min(len(c) for c in per_call)
    return [{"index": i, "op": op_type(per_call[0][i][0]), "ms": min(c[i][1] for c in per_call) / 1e6} for i in range(n)]

def slowest(per_call: list[list[tuple[str, int]]], k: int) -> list[dict]:
    """The k slowest single ops (`per_op`'s entries)."""
    return sorted(per_op(per_call), key=lambda o: -o["ms"])[:k]

def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--calls", type=int, default=8)
    p.add_argument("--function", default="main", help="main (one decode step) or prefill (one full chunk)")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--slowest", type=int, default=0, help="also list the K slowest single ops, by position in the call")
    p.add_argument("--json", action="store_true")
    p.add_argument("--per-op", action="store_true", help="with --json: every op of the call, in order (index, type, ms)")
    a = p.parse_args()
    per_call, profiled_ms = profile(Bundle.open(a.bundle), a.calls, function=a.function)
    table, single = by_op_type(per_call), slowest(per_call, a.slowest)
    if a.json:
        every = {"per_op": per_op(per_call)} if a.per_op else {}
        print(json.dumps({"profiled_ms_per_call": profiled_ms, "ops": table} | ({"slowest": single} if single else {}) | every, indent=2))
        return
    total = sum(r["ms"] for r in table.values())
    print(f"{a.bundle}: {len(per_call[0])} timed ops per call; sum of per-op minima {total:.1f} ms "
          f"(profiled call {profiled_ms:.1f} ms, profiler overhead included)")  # fmt: skip
    for name, r in list(table.items())[: a.top]:
        print(f"  {name:36} {r['ms']:8.2f} ms {100 * r['share']:5.1f}% {r['ops']:5d} ops")
    if single:
        print(f"the {len(single)} slowest single ops (position in the call of {len(per_call[0])}):")
        for o in single:
            print(f"  #{o['index']:<5} {o['op']:30} {o['ms']:8.2f} ms {100 * o['ms'] / total:5.1f}%")

if __name__ == "__main__":
    main()
