"""How to read and write a stacked [L, ...] state on the Linux Core AI runtime.

Each variant reads the L layer slices of a stacked state, scales them (stand-in for the
layer's update) and writes the state back once. Shapes default to rwkv7-0.1b's recState
([12, 1, 12, 64, 64] fp32). Prints ms per call for each variant.

    python benchmarks/state_io.py
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
import torch

import ssmport  # noqa: F401  (silences coreai-torch's version warning)
from ssmport.ops.rows import read_layer, stack_rows, write_once

from coreai_micro import call_times_ms  # noqa: E402  (benchmarks/ is on sys.path when run as a script)


def _index_select(buffer: torch.Tensor, i: int) -> torch.Tensor:  # ssmport's read before the lookup
    flat = buffer.reshape(buffer.shape[0], -1)
    return torch.index_select(flat, 0, torch.tensor([i])).view(buffer.shape[1:])


class StateIO(torch.nn.Module):
    """Reads: slice (`rec[i]`), split (`unbind`), index_select (gather_along_axis), lookup
    (`state.read_layer`: embedding -> gather_nd). Writes: stack / cat (concat), scatter
    (`state.write_once`: a chain of index_copy), whole (one op over the whole state, the way
    RWKV-7's deferred WKV update writes: reads by lookup, small rows stacked, one update)."""

    def __init__(self, mode: str, shape: tuple[int, ...]):
        super().__init__()
        self.mode = mode
        self.register_buffer("rec", torch.zeros(shape))

    def forward(self, x):
        L = self.rec.shape[0]
        read, write = self.mode.split("+")
        if read == "slice":
            pieces = [self.rec[i] * x for i in range(L)]
        elif read == "split":
            pieces = [piece * x for piece in self.rec.unbind(0)]
        elif read == "index_select":
            pieces = [_index_select(self.rec, i) * x for i in range(L)]
        elif read == "lookup":
            pieces = [read_layer(self.rec, i) * x for i in range(L)]
        else:  # "none": the write alone, from rows not read from the state
            pieces = [self.rec.new_ones(self.rec.shape[1:]) * (x + i) for i in range(L)]
        if write == "stack":
            self.rec.copy_(torch.stack(pieces))
        elif write == "cat":
            self.rec.copy_(torch.cat([p.reshape(-1) for p in pieces]).view(self.rec.shape))
        elif write == "scatter":
            write_once(self.rec, pieces)
        elif write == "whole":  # a small row per layer, stacked; one update of the whole state
            rows = stack_rows([p.reshape(-1)[:64] for p in pieces]).view(L, *[1] * (self.rec.dim() - 2), 64)
            self.rec.copy_(self.rec * x - rows.sum(-1, keepdim=True))
        else:  # "none": lower bound, one elementwise op over the whole state
            self.rec.copy_(self.rec * x)
        return x + 1


MODES = ("slice+stack", "slice+cat", "slice+scatter", "split+scatter", "index_select+scatter",
         "lookup+scatter", "none+scatter", "lookup+cat", "lookup+whole", "none+none")  # fmt: skip


def time_variant(mode: str, shape, calls: int) -> float:
    """Median ms per call."""
    times = call_times_ms(StateIO(mode, shape), np.ones(1, np.float32), calls, {"rec": np.zeros(shape, np.float32)})
    return float(np.median(times))


def main() -> None:
    warnings.simplefilter("ignore", FutureWarning)  # torch-internal pytree deprecation
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="12,1,12,64,64")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--modes", default=",".join(MODES), help="read+write pairs (default: all)")
    a = p.parse_args()
    shape = tuple(int(d) for d in a.shape.split(","))
    print(f"stacked state {list(shape)} fp32, {a.calls} calls each")
    p_modes = a.modes.split(",")
    for mode in p_modes:
        print(f"  {mode:22} {time_variant(mode, shape, a.calls):8.2f} ms/call (median)")


if __name__ == "__main__":
    main()
