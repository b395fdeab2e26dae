"""Decode speed and load time of a bundle: Core AI runtime vs torch eager, same process."""

from __future__ import annotations

import shutil
import time

import numpy as np
import torch

from ssmport.bundle import Bundle
from ssmport.runtime import Runner, lowered_path


def _ms_per_token(runner, tokens: list[int], warmup: int) -> float:
    runner.reset()
    for t in tokens[:warmup]:
        runner.step(t)
    start = time.perf_counter()
    for t in tokens[warmup:]:
        runner.step(t)
    return 1000 * (time.perf_counter() - start) / max(1, len(tokens) - warmup)


def _prompt_tokens_per_s(runner, length: int, vocab: int) -> float:
    """Prompt ingestion through `runner.feed` (chunked prefill) from a fresh state."""
    prompt = np.random.default_rng(1).integers(1, vocab, size=length).tolist()
    runner.reset()
    runner.feed(prompt)  # warm-up: the first call of a function pays one-time setup
    runner.reset()
    start = time.perf_counter()
    runner.feed(prompt)
    return length / (time.perf_counter() - start)


def bench_bundle(
    bundle: Bundle,
    steps: int = 32,
    warmup: int = 4,
    torch_backend: bool = True,
    weights=None,
    prompt_tokens: int = 128,
) -> dict:
    vocab = int(bundle.manifest["outputs"][0]["shape"][-1])
    tokens = np.random.default_rng(0).integers(1, vocab, size=steps + warmup).tolist()
    result: dict = {"bundle": str(bundle.path), "recipe": bundle.manifest["recipe"]["name"], "steps": steps}

    shutil.rmtree(lowered_path(bundle), ignore_errors=True)  # first load = lower + load
    start = time.perf_counter()
    runner = Runner(bundle)
    result["load_first_s"] = time.perf_counter() - start
    runner.close()
    start = time.perf_counter()
    runner = Runner(bundle)
    result["load_second_s"] = time.perf_counter() - start
    try:
        result["coreai_ms_per_token"] = _ms_per_token(runner, tokens, warmup)
        result["decode_tokens_per_s"] = 1000 / result["coreai_ms_per_token"]
        if runner.has_prefill:
            result["prefill_tokens_per_s"] = _prompt_tokens_per_s(runner, prompt_tokens, vocab)
            result["prefill_prompt_tokens"] = prompt_tokens
    finally:
        runner.close()

    if torch_backend:
        from ssmport.sources import rebuild_source
        from ssmport.torch_runner import TorchRunner

        ref = TorchRunner(rebuild_source(bundle.manifest["source"], weights), "fp32")
        default_threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            result["torch_fp32_1thread_ms_per_token"] = _ms_per_token(ref, tokens, warmup)
            torch.set_num_threads(default_threads)
            result["torch_fp32_ms_per_token"] = _ms_per_token(ref, tokens, warmup)
            result["torch_threads"] = default_threads
        finally:
            torch.set_num_threads(default_threads)
            ref.close()
    return result
