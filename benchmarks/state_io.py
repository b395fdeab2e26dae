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
        elif self.mode == "split+scatter":  # one split op reads every layer
            write_once(self.rec, [piece * x for piece in self.rec.unbind(0)])
        elif self.mode == "slice+scatter":
            write_once(self.rec, [self.rec[i] * x for i in range(L)])
        elif self.mode.startswith("embed+"):  # row lookup (gather_nd) reads
            flat = self.rec.reshape(L, -1)
            pieces = [torch.nn.functional.embedding(torch.tensor([i]), flat) * x for i in range(L)]
            if self.mode == "embed+tree":
                while len(pieces) > 1:
                    merged = []
                    for j in range(0, len(pieces) - 1, 2):
                        a, b = pieces[j], pieces[j + 1]
                        m, n = a.shape[0], b.shape[0]
                        out = torch.zeros(m + n, a.shape[1])
                        out = out.index_copy(0, torch.arange(m), a).index_copy(0, torch.arange(m, m + n), b)
                        merged.append(out)
                    if len(pieces) % 2:
                        merged.append(pieces[-1])
                    pieces = merged
                self.rec.copy_(pieces[0].view(self.rec.shape))
            elif self.mode == "embed+scatter":
                write_once(self.rec, pieces)
            else:
                self.rec.copy_(torch.cat(pieces).view(self.rec.shape))
        elif self.mode == "embed-read-only":  # reads, plus the lower-bound whole write
            flat = self.rec.reshape(L, -1)
            total = sum(torch.nn.functional.embedding(torch.tensor([i]), flat)[0, :1] for i in range(L))
            self.rec.copy_(self.rec * x)
            return x + total
        elif self.mode == "scatter-write-only":  # scatter chain of pieces not read from the state
            pieces = [self.rec.new_ones(self.rec[0].shape) * (x + i) for i in range(L)]
            write_once(self.rec, pieces)
        elif self.mode.startswith("cat-halves"):  # concat of k big pieces, k = suffix
            k = int(self.mode.rsplit("-", 1)[-1])
            parts = (self.rec * x).reshape(L, -1).chunk(k)
            self.rec.copy_(torch.cat([p_ + 1 for p_ in parts]).view(self.rec.shape))
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
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            loop.run_until_complete(fn(inputs=x, state=state))
            times.append(time.perf_counter() - start)
        elapsed = float(np.median(times))
        del fn, model
        loop.close()
    return 1000 * elapsed


def main() -> None:
    warnings.simplefilter("ignore", FutureWarning)  # torch-internal pytree deprecation
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="12,1,12,64,64")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--modes", default="slice+stack,slice+cat-flat,gather+scatter,split+scatter,slice+scatter,whole")
    a = p.parse_args()
    shape = tuple(int(d) for d in a.shape.split(","))
    print(f"stacked state {list(shape)} fp32, {a.calls} calls each")
    p_modes = a.modes.split(",")
    for mode in p_modes:
        print(f"  {mode:16} {time_variant(mode, shape, a.calls):8.2f} ms/call (median)")


if __name__ == "__main__":
    main()
