"""Prompt ingestion speed: the bundle's chunked `prefill` function vs the M=1 loop of `main`.

For each model: export a synthetic fp32 bundle with and without prefill (export time and
asset size of both), then, on the one bundle with prefill, feed random prompts from a zero
state through `prefill` and through the M=1 loop, both in this process, alternating, and
report tokens/s and their ratio. It also checks the two paths agree (max |Δ| over the last
logits and every state).

The ceiling: what prefill could reach if every op but the weight matmuls were free. Each of the
bundle's matmul weights (the plan's ffn / state_proj / out_proj / attn_proj / lora tensors) is
timed on this runtime as the graph runs it (`FloatMatmul`, a chunk's T rows, best of 5 calls,
in this run), plus the LM head once at one row (prefill's logits are the last valid row's);
their sum is a chunk's matmul time, and T over it the ceiling in tokens/s. Not counted: the
recurrence's own chunk-form products and attention over the KV cache (they are part of what
the ceiling leaves out). A runtime Profiler pass over one chunk (per op type, minimum of 2
calls) says where the rest of a chunk's time goes. Run it under the heavy lock; the machine is shared, so compare
the ratios, not the absolute numbers.

    flock /tmp/ssmport-heavy.lock python benchmarks/prefill_speed.py \\
        --models rwkv7-0.1b rwkv7-1.5b --prompts 64 512 --out benchmarks/results/prefill_speed.json
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

# benchmarks/ is on sys.path when run as a script
from coreai_micro import call_times_ms
from profile_ops import by_op_type, profile

from ssmport.bundle import Bundle, dir_bytes
from ssmport.exporter.pipeline import export
from ssmport.ops.matmul import FloatMatmul
from ssmport.prefill import DEFAULT_CHUNK
from ssmport.quant.roles import Role
from ssmport.runtime import Runner, lowered_path

MATMUL_ROLES = frozenset({Role.FFN, Role.STATE_PROJ, Role.OUT_PROJ, Role.ATTN_PROJ, Role.LORA})
PROFILE_TOP = 8  # op types kept from the chunk's profile


def timed_feed(runner: Runner, tokens: list[int]) -> tuple[float, np.ndarray, dict[str, np.ndarray]]:
    runner.reset()
    start = time.perf_counter()
    logits = runner.feed(tokens)
    seconds = time.perf_counter() - start
    return seconds, logits, {n: runner.state(n) for n in runner.state_names}


def recurrence_share(runner: Runner, repeats: int) -> dict:
    """One prefill call with valid_len=1 vs valid_len=T: every batched op runs on T rows
    either way, so the difference is the in-graph loop's T-1 extra steps."""
    T = runner.prefill_chunk
    one = min(timed_feed(runner, [1])[0] for _ in range(repeats))
    full = min(timed_feed(runner, list(range(1, T + 1)))[0] for _ in range(repeats))
    return {"call_seconds_valid_len_1": one, "call_seconds_valid_len_T": full, "loop_share": (full - one) / full}


def matmul_ms(shape: tuple[int, int], rows: int, calls: int = 5) -> float:
    """Best wall time of x [rows, in] @ W [in, out] on this runtime, in the graph's form."""
    rng = np.random.default_rng(0)
    w = torch.from_numpy(rng.standard_normal(shape, dtype=np.float32) * 0.02)
    x = rng.standard_normal((rows, shape[0]), dtype=np.float32)
    return min(call_times_ms(FloatMatmul(w), x, calls))


def matmul_ceiling(bundle: Path, chunk: int) -> dict:
    """A chunk's weight-matmul time on this runtime, and the prefill tokens/s it allows."""
    tensors = Bundle.open(bundle).manifest.plan_tensors
    shapes = collections.Counter(tuple(t["shape"]) for t in tensors if t["role"] in MATMUL_ROLES)
    per_shape = {shape: matmul_ms(shape, chunk) for shape in shapes}
    heads = [tuple(t["shape"]) for t in tensors if t["role"] == Role.HEAD]
    head_ms = sum(matmul_ms(shape, 1) for shape in heads)
    chunk_ms = sum(n * per_shape[shape] for shape, n in shapes.items()) + head_ms
    flops = sum(2 * chunk * n * shape[0] * shape[1] for shape, n in shapes.items())
    print(f"  ceiling: {chunk_ms:.0f} ms of weight matmuls per {chunk}-token chunk "
          f"({flops / chunk_ms / 1e6:.1f} GFLOP/s over {sum(shapes.values())} matmuls) = "
          f"{1000 * chunk / chunk_ms:.1f} tok/s", flush=True)  # fmt: skip
    return {
        "chunk_matmul_ms": chunk_ms,
        "head_ms": head_ms,
        "matmul_gflops_per_chunk": flops / 1e9,
        "matmul_gflop_per_s": flops / chunk_ms / 1e6,
        "per_shape_ms": {f"{a}x{b}": {"ms": ms, "count": shapes[(a, b)]} for (a, b), ms in per_shape.items()},
        "ceiling_tokens_per_s": 1000 * chunk / chunk_ms,
    }


def chunk_profile(bundle: Path) -> dict:
    """Where one full prefill chunk's time goes, per op type (runtime Profiler)."""
    per_call, profiled_ms = profile(Bundle.open(bundle), calls=2, warmup=1, function="prefill")
    table = by_op_type(per_call)
    top = dict(list(table.items())[:PROFILE_TOP])
    print("  chunk profile: " + ", ".join(f"{k} {100 * v['share']:.0f}%" for k, v in top.items()), flush=True)
    return {"ops_per_chunk": len(per_call[0]), "profiled_ms_per_call": profiled_ms,
            "sum_of_op_minima_ms": sum(v["ms"] for v in table.values()), "top_op_types": top}  # fmt: skip


def _warm(runner: Runner) -> None:
    timed_feed(runner, [1] * 8)  # first call of each function: one-time setup off the clock


def measure(bundle: Path, prompts: list[int], repeats: int, seed: int, together: bool = True) -> list[dict]:
    """`together`: both runners loaded at once and their runs alternated, so background load
    hits both alike. Otherwise (a bundle too large to load twice) one runner at a time: every
    prefill run, then every M=1 run."""
    rng = np.random.default_rng(seed)
    prompt_tokens = [rng.integers(1, Bundle.open(bundle).manifest.vocab_size, size=n).tolist() for n in prompts]
    if together:
        with Runner(bundle, prefill=True) as fast, Runner(bundle, prefill=False) as slow:
            _warm(fast)
            _warm(slow)
            runs = [[(timed_feed(fast, t), timed_feed(slow, t)) for _ in range(repeats)] for t in prompt_tokens]
    else:
        with Runner(bundle, prefill=True) as fast:
            _warm(fast)
            fast_runs = [[timed_feed(fast, t) for _ in range(repeats)] for t in prompt_tokens]
        with Runner(bundle, prefill=False) as slow:
            _warm(slow)
            slow_runs = [[timed_feed(slow, t) for _ in range(repeats)] for t in prompt_tokens]
        runs = [list(zip(f, s)) for f, s in zip(fast_runs, slow_runs)]
    rows = []
    for length, pairs in zip(prompts, runs):
        t_fast, t_slow = [f[0] for f, _ in pairs], [s[0] for _, s in pairs]
        (_, logits_fast, states_fast), (_, logits_slow, states_slow) = pairs[-1]
        delta = max(
            float(np.abs(logits_fast - logits_slow).max()),
            *(float(np.abs(states_fast[n] - states_slow[n]).max()) for n in states_fast),
        )
        best_fast, best_slow = min(t_fast), min(t_slow)
        rows.append({
            "prompt_tokens": length,
            "prefill_tokens_per_s": length / best_fast,
            "m1_loop_tokens_per_s": length / best_slow,
            "speedup": best_slow / best_fast,
            "prefill_seconds": t_fast,
            "m1_loop_seconds": t_slow,
            "max_abs_delta_logits_and_states": delta,
        })  # fmt: skip
        print(f"  prompt {length:4}: prefill {length / best_fast:8.1f} tok/s, M=1 loop "
              f"{length / best_slow:7.1f} tok/s, {best_slow / best_fast:.2f}x, max|Δ| {delta:.2e}", flush=True)  # fmt: skip
    with Runner(bundle, prefill=True) as fast:
        share = recurrence_share(fast, repeats + 1)
    print(f"  one chunk: {share['call_seconds_valid_len_1']:.3f} s at valid_len=1, "
          f"{share['call_seconds_valid_len_T']:.3f} s at valid_len=T (loop share {share['loop_share']:.0%})", flush=True)  # fmt: skip
    return rows, share


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["rwkv7-0.1b", "rwkv7-1.5b"])
    ap.add_argument("--prompts", nargs="+", type=int, default=[64, 512])
    ap.add_argument("--chunk", type=int, default=DEFAULT_CHUNK)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the results JSON here")
    ap.add_argument("--skip-decode-only-export", action="store_true",
                    help="do not export the decode-only bundle (no export-time / asset-size comparison)")
    args = ap.parse_args()

    results = {
        "machine": f"{platform.machine()} {platform.system()}, shared with other jobs (compare ratios)",
        "chunk": args.chunk,
        "models": [],
    }
    with tempfile.TemporaryDirectory(prefix="prefill-speed-") as tmp:
        for model in args.models:
            print(f"{model} (synthetic, fp32, chunk {args.chunk})", flush=True)
            entry: dict = {"model": model}
            variants = [("decode_only", None)] * (not args.skip_decode_only_export) + [("with_prefill", args.chunk)]
            for label, chunk in variants:
                start = time.perf_counter()
                res = export(model, tmp, synthetic=True, quant="fp32", gate=False, progress=False,
                             prefill_chunk=chunk, name=f"{model}-{label}")  # fmt: skip
                entry[f"export_seconds_{label}"] = time.perf_counter() - start
                entry[f"export_stage_seconds_{label}"] = res.timings["stage_seconds"]
                entry[f"asset_bytes_{label}"] = dir_bytes(res.path / "model.aimodel")
                if chunk is None:
                    shutil.rmtree(res.path)  # only its export time and size are wanted
                else:
                    bundle = res.path
            if "asset_bytes_decode_only" in entry:
                entry["asset_growth"] = entry["asset_bytes_with_prefill"] / entry["asset_bytes_decode_only"] - 1
                print(f"  export {entry['export_seconds_decode_only']:.1f} s decode-only, "
                      f"{entry['export_seconds_with_prefill']:.1f} s with prefill; asset +{100 * entry['asset_growth']:.3f}%",
                      flush=True)  # fmt: skip
            entry["runs"], entry["recurrence"] = measure(bundle, args.prompts, args.repeats, args.seed)
            entry["ceiling"] = matmul_ceiling(bundle, args.chunk)
            for run in entry["runs"]:
                run["of_ceiling"] = run["prefill_tokens_per_s"] / entry["ceiling"]["ceiling_tokens_per_s"]
                print(f"  prompt {run['prompt_tokens']:4}: {100 * run['of_ceiling']:.0f}% of the ceiling", flush=True)
            entry["chunk_profile"] = chunk_profile(bundle)
            shutil.rmtree(lowered_path(Bundle.open(bundle)), ignore_errors=True)  # GBs at 1.5B
            shutil.rmtree(bundle)
            results["models"].append(entry)
    text = json.dumps(results, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
