"""Time a small torch module on the Linux Core AI runtime (for the microbenchmarks here)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def call_times_ms(module: torch.nn.Module, x: np.ndarray, calls: int, states: dict[str, np.ndarray] | None = None) -> list[float]:
    """Convert `module` (forward(x) -> y; its buffers named in `states` are Core AI states),
    lower it, and return the wall time of `calls` calls after 3 untimed ones."""
    import coreai_torch
    from coreai.runtime import AIModel, NDArray
    from coreai_torch import TorchConverter

    states = states or {}
    ep = torch.export.export(module.eval(), (torch.from_numpy(x),)).run_decompositions(coreai_torch.get_decomp_table())
    with contextlib.redirect_stdout(io.StringIO()):
        program = (
            TorchConverter(mode=TorchConverter.Mode.RELEASE)
            .add_exported_program(ep, input_names=["x"], output_names=["y"], state_names=list(states))
            .to_coreai()
        )
    with tempfile.TemporaryDirectory() as tmp:
        asset = program.save_asset(Path(tmp) / "m.aimodel")
        lowered = Path(tmp) / "m.aimodelx"
        lowered.mkdir()
        asset._write_odix(lowered)  # private in coreai-core 1.0.0b3 (see ssmport.runtime)
        loop = asyncio.new_event_loop()
        model = loop.run_until_complete(AIModel.load(lowered))
        fn = model.load_function("main")
        bound = {name: NDArray(value) for name, value in states.items()}
        inputs = {"x": NDArray(x)}
        for _ in range(3):
            loop.run_until_complete(fn(inputs=inputs, state=bound))
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            loop.run_until_complete(fn(inputs=inputs, state=bound))
            times.append(1000 * (time.perf_counter() - start))
        del fn, model
        loop.close()
    return times
