"""Speed of a bundle: load times, decode ms/token, bytes moved per token, and how that
compares with the machine's memory bandwidth; optionally the torch eager reference in the
same process.

The JSON keys of `bench_bundle` are read by external checks; keep them stable:
`load_s_first`, `load_s_cached`, `decode_ms_per_token`, `prefill_tokens_per_s`,
`state_bytes`, `asset_bytes`, `weight_bytes_per_token`, `effective_gb_per_s`,
`ops_per_decode_call`, `ops_per_prefill_chunk`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from ssmport.bundle import Bundle, dir_bytes
from ssmport.layout import MAIN_CALL, PREFILL_CALL
from ssmport.manifest import Manifest
from ssmport.runtime import Runner, forget_lowering
from ssmport.runtime.op_count import count_ops

DEFAULT_STEPS = 64
DEFAULT_WARMUP = 8
DEFAULT_PREFILL_TOKENS = 64
LOOKUP_ROLES = frozenset({"embedding"})  # plan roles read one row per token, not whole
BANDWIDTH_BUFFER_BYTES = 512 << 20  # far larger than any L3 cache here (32 MB)
BANDWIDTH_SLICE_BYTES = 64 << 20  # each sample reads 2x L3, after 448 MB of other data


def weight_bytes_per_token(manifest: Manifest) -> int:
    """Bytes of weights one decode step reads, from the manifest's per-tensor plan: every
    stored tensor once, except lookup tables (the embedding), which give one row, and expert
    stacks, which give the rows a token reads (its top-k experts: active, not total, weights)."""
    total = 0
    for entry in manifest.plan_tensors:
        if entry.get("rows_read"):
            total += entry["bytes"] * entry["rows_read"] // entry["shape"][0]
        elif entry["role"] in LOOKUP_ROLES:
            total += entry["bytes"] // entry["shape"][0]
        else:
            total += entry["bytes"]
    return total


def state_bytes(manifest: Manifest) -> int:
    """Bytes of every state at its largest (a growing KV cache at the whole context)."""
    return sum(math.prod(s.full_shape) * np.dtype(s.dtype).itemsize for s in manifest.states)


def measure_read_bandwidth(nbytes: int = BANDWIDTH_BUFFER_BYTES, repeats: int = 8) -> float:
    """Single-thread memory read bandwidth in GB/s: numpy sums (one thread) over 64 MB slices
    of a buffer much larger than the caches, best slice over `repeats` passes. Short samples
    and the best of many keep other jobs on a shared machine from dragging it down."""
    buf = np.ones(nbytes // 4, dtype=np.float32)  # written once, so every page is resident
    slices = np.array_split(buf, max(1, nbytes // BANDWIDTH_SLICE_BYTES))
    best = 0.0
    for _ in range(repeats):
        for piece in slices:
            start = time.perf_counter()
            piece.sum()
            best = max(best, piece.nbytes / (time.perf_counter() - start))
    return best / 1e9


def step_times_ms(step: Callable[[int], object], reset: Callable[[], None], tokens: list[int], warmup: int) -> list[float]:
    """Per-token wall times (ms) of `step` over tokens[warmup:], after a fresh reset."""
    reset()
    for t in tokens[:warmup]:
        step(t)
    times = []
    for t in tokens[warmup:]:
        start = time.perf_counter()
        step(t)
        times.append(1000 * (time.perf_counter() - start))
    return times


def bench_tokens(vocab: int, count: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(1, vocab, size=count).tolist()


def bench_bundle(
    bundle: Bundle,
    steps: int = DEFAULT_STEPS,
    warmup: int = DEFAULT_WARMUP,
    torch_backend: bool = False,
    weights=None,
    roofline: bool = True,
    prefill_tokens: int = DEFAULT_PREFILL_TOKENS,
) -> dict:
    m = bundle.manifest
    vocab = m.vocab_size
    tokens = bench_tokens(vocab, steps + warmup)
    result: dict = {"bundle": str(bundle.path), "recipe": m.recipe.name, "steps": steps, "warmup": warmup}

    forget_lowering(bundle)  # so the first load is what a user's first load is: hash + lower + load
    start = time.perf_counter()
    Runner(bundle).close()
    result["load_s_first"] = time.perf_counter() - start
    start = time.perf_counter()
    runner = Runner(bundle)
    result["load_s_cached"] = time.perf_counter() - start
    try:
        result["paged_in_bytes"] = runner.page_in()  # the peers' weights are in memory too
        times = step_times_ms(runner.step, runner.reset, tokens, warmup)
        # the KV positions the last decode call read (a growing cache's allocation, else the context)
        kv_positions = runner.kv_positions or m.context
        ring_slots = runner.ring_slots or max((s.window for s in m.ring_states), default=None)
        result["decode_ms_per_token"] = float(np.median(times))
        result["decode_ms_per_token_min"] = float(np.min(times))
        result["prefill_tokens_per_s"] = None
        # how `feed` takes a prompt here: the prefill chunks, or main one token a call where the
        # chunks would cost more on this runtime (ssmport.runtime.prompt_path)
        result["prompt_calls"] = PREFILL_CALL if runner.has_prefill else MAIN_CALL
        if m.prefill is not None:
            prompt = bench_tokens(vocab, prefill_tokens, seed=1)
            runner.reset()
            runner.feed(prompt)  # warm-up: the first call of a function pays one-time setup
            runner.reset()
            start = time.perf_counter()
            runner.feed(prompt)
            result["prefill_tokens_per_s"] = prefill_tokens / (time.perf_counter() - start)
            result["prefill_tokens"] = prefill_tokens
    finally:
        runner.close()

    ops = count_ops(bundle)  # a separate, profiled load: the profiler would slow the timed calls
    result["ops_per_decode_call"] = ops["main"].ops
    result["ops_per_prefill_chunk"] = ops["prefill"].ops if "prefill" in ops else None
    result["runtime_ops"] = {function: count.to_json() for function, count in ops.items()}
    result["state_bytes"] = state_bytes(m)
    result["context"] = m.context  # None: no kv state
    result["kv_bytes_per_token"] = m.kv_bytes_per_token
    # KV bytes a decode call read at the end of the timed steps (steps + warmup tokens held): they
    # follow the tokens held in a growing cache (256 positions, doubled), the context in a static one
    result["kv_positions_read"] = kv_positions
    result["kv_bytes_read_per_token"] = m.kv_bytes_per_token * (kv_positions or 0)
    # the ring slots a decode call read (a growing ring's allocation, else its window)
    result["ring_slots_read"] = ring_slots
    result["ring_bytes_read_per_token"] = m.ring_bytes_per_slot * (ring_slots or 0)
    result["fixed_state_bytes"] = m.fixed_state_bytes
    result["asset_bytes"] = dir_bytes(bundle.asset_path)
    result["weight_bytes_per_token"] = weight_bytes_per_token(m)
    result["effective_gb_per_s"] = result["weight_bytes_per_token"] / result["decode_ms_per_token"] / 1e6
    if roofline:
        result["read_bandwidth_gb_per_s"] = measure_read_bandwidth()
        result["roofline_fraction"] = result["effective_gb_per_s"] / result["read_bandwidth_gb_per_s"]

    if torch_backend:
        result |= bench_torch_eager(bundle, tokens, warmup, weights)
    return result


def bench_torch_eager(bundle: Bundle, tokens: list[int], warmup: int, weights=None) -> dict:
    """Median ms/token of the fp32 torch eager reference of the same model, at 1 thread and
    at torch's default thread count."""
    import torch

    from ssmport.loader.resolve import rebuild_bundle_source
    from ssmport.gate.torch_runner import TorchRunner

    out: dict = {}
    ref = TorchRunner(rebuild_bundle_source(bundle.manifest, weights), "fp32")
    default_threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        out["torch_ms_per_token_1thread"] = float(np.median(step_times_ms(ref.step, ref.reset, tokens, warmup)))
        torch.set_num_threads(default_threads)
        out["torch_ms_per_token"] = float(np.median(step_times_ms(ref.step, ref.reset, tokens, warmup)))
        out["torch_threads"] = default_threads
    finally:
        torch.set_num_threads(default_threads)
        ref.close()
    return out
