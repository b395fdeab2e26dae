"""How to read and write a stacked [L, ...] state on the Linux Core AI runtime.

Each variant reads the L layer slices of a stacked state, scales them (stand-in for the
layer's update) and writes the state back once. Shapes default to rwkv7-0.1b's recState
([12, 1, 12, 64, 64] fp32). Prints ms per call for each variant.

    python benchmarks/state_io.py
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

import ssmport  # noqa: F401  (silences coreai-torch's version warning)
from ssmport.state import read_layer, write_once


class StateIO(torch.nn.Module):
    def __init__(self, mode: str, shape: tuple[int, ...]):
        super().__init__()
        self.mode = mode
        self.register_buffer("rec", torch.zeros(shape))

    def forward(self, x):
        L = self.rec.shape[0]
        if self.mode == "slice+stack":  # rec[i] reads, torch.stack write
            self.rec.copy_(torch.stack([self.rec[i] * x for i in range(L)]))
        elif self.mode == "slice+cat-flat":
            parts = [(self.rec[i] * x).reshape(-1) for i in range(L)]
            self.rec.copy_(torch.cat(parts).view(self.rec.shape))
        elif self.mode == "gather+scatter":  # what ssmport does (state.read_layer / write_once)
            write_once(self.rec, [read_layer(self.rec, i) * x for i in range(L)])
        elif self.mode == "whole":  # lower bound: one elementwise op over the whole state
            self.rec.copy_(self.rec * x)
        return x + 1


def time_variant(mode: str, shape, calls: int) -> float:
    import coreai_torch
    from coreai.authoring import AIModelAsset
    from coreai.runtime import AIModel, NDArray
    from coreai_torch import TorchConverter

    ep = torch.export.export(StateIO(mode, shape), (torch.ones(1),))
    ep = ep.run_decompositions(coreai_torch.get_decomp_table())
    with contextlib.redirect_stdout(io.StringIO()):
        program = (
            TorchConverter(mode=TorchConverter.Mode.RELEASE)
            .add_exported_program(ep, input_names=["x"], output_names=["y"], state_names=["rec"])
            .to_coreai()
        )
    with tempfile.TemporaryDirectory() as tmp:
        asset = program.save_asset(Path(tmp) / "m.aimodel")
        lowered = Path(tmp) / "m.aimodelx"
        lowered.mkdir()
        asset._write_odix(lowered)
        loop = asyncio.new_event_loop()
        model = loop.run_until_complete(AIModel.load(lowered))
        fn = model.load_function("main")
        state = {"rec": NDArray(np.zeros(shape, np.float32))}
        x = {"x": NDArray(np.ones(1, np.float32))}
        for _ in range(3):
            loop.run_until_complete(fn(inputs=x, state=state))
        start = time.perf_counter()
        for _ in range(calls):
            loop.run_until_complete(fn(inputs=x, state=state))
        elapsed = (time.perf_counter() - start) / calls
        del fn, model
        loop.close()
    return 1000 * elapsed


def main() -> None:
    warnings.simplefilter("ignore", FutureWarning)  # torch-internal pytree deprecation
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="12,1,12,64,64")
    p.add_argument("--calls", type=int, default=20)
    a = p.parse_args()
    shape = tuple(int(d) for d in a.shape.split(","))
    print(f"stacked state {list(shape)} fp32, {a.calls} calls each")
    for mode in ("slice+stack", "slice+cat-flat", "gather+scatter", "whole"):
        print(f"  {mode:16} {time_variant(mode, shape, a.calls):8.2f} ms/call")


if __name__ == "__main__":
    main()
