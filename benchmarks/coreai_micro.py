"""Time a small torch module on the Linux Core AI runtime (for the microbenchmarks here)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch


@contextlib.contextmanager
def loaded_model(module: torch.nn.Module, x: np.ndarray, state_names: list[str]) -> Iterator[tuple]:
    """Convert `module` (forward(x) -> y; the buffers named in `state_names` are Core AI
    states) and lower it once; yield (event loop, loaded model), whose `main` may be loaded
    more than once (with and without a profiler)."""
    import coreai_torch
    from coreai.runtime import AIModel
    from coreai_torch import TorchConverter

    ep = torch.export.export(module.eval(), (torch.from_numpy(x),)).run_decompositions(coreai_torch.get_decomp_table())
    with contextlib.redirect_stdout(io.StringIO()):
        program = (
            TorchConverter(mode=TorchConverter.Mode.RELEASE)
            .add_exported_program(ep, input_names=["x"], output_names=["y"], state_names=state_names)
            .to_coreai()
        )
    with tempfile.TemporaryDirectory() as tmp:
        asset = program.save_asset(Path(tmp) / "m.aimodel")
        del program
        lowered = Path(tmp) / "m.aimodelx"
        lowered.mkdir()
        asset._write_odix(lowered)  # private in coreai-core 1.0.0b3 (see ssmport.runtime)
        loop = asyncio.new_event_loop()
        model = loop.run_until_complete(AIModel.load(lowered))
        try:
            yield loop, model
        finally:
            del model
            loop.close()


@contextlib.contextmanager
def loaded_main(module: torch.nn.Module, x: np.ndarray, state_names: list[str], profiler=None) -> Iterator[tuple]:
    """`loaded_model`'s `main` (with `profiler`, when given): yield (event loop, main)."""
    with loaded_model(module, x, state_names) as (loop, model):
        fn = model.load_function("main") if profiler is None else model.load_function("main", profiler=profiler)
        try:
            yield loop, fn
        finally:
            del fn


def call_times_ms(module: torch.nn.Module, x: np.ndarray, calls: int, states: dict[str, np.ndarray] | None = None) -> list[float]:
    """Convert `module` (forward(x) -> y; its buffers named in `states` are Core AI states),
    lower it, and return the wall time of `calls` calls after 3 untimed ones."""
    from coreai.runtime import NDArray

    states = states or {}
    with loaded_main(module, x, list(states)) as (loop, fn):
        bound = {name: NDArray(value) for name, value in states.items()}
        return timed_calls(loop, fn, {"x": NDArray(x)}, bound, calls)


def timed_calls(loop, fn, inputs: dict, state: dict, calls: int) -> list[float]:
    """The wall times (ms) of `calls` calls of a loaded function after 3 untimed ones."""
    for _ in range(3):
        loop.run_until_complete(fn(inputs=inputs, state=state))
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        loop.run_until_complete(fn(inputs=inputs, state=state))
        times.append(1000 * (time.perf_counter() - start))
    return times
