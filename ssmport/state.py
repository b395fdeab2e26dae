"""Typed, named recurrent state.

A Core AI state is a buffer the graph mutates in place. Each architecture declares its
states once, as `StateSpec`s, in a fixed order; the exporter, the runner, the manifest and
the tests all read that one declaration.

Apple's GPU delegate keeps only one write per state handle, so a decode step must write each
state exactly once: layers *return* their new slices and `write_once` gathers them into a
single in-place copy per state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

# Storage dtypes a state may have, by the names used on the CLI and in manifests.
STATE_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "float32": torch.float32,
    "float16": torch.float16,
}
NUMPY_DTYPES: dict[torch.dtype, np.dtype] = {
    torch.float32: np.dtype(np.float32),
    torch.float16: np.dtype(np.float16),
}


@dataclass(frozen=True)
class StateSpec:
    """One Core AI state: its graph name, shape, storage dtype and layout legend."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    layout: str  # human-readable axis legend, e.g. "[layer, batch, head, key, value]"

    @property
    def numpy_dtype(self) -> np.dtype:
        return NUMPY_DTYPES[self.dtype]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.numpy_dtype.itemsize

    def zeros(self) -> np.ndarray:
        """A zero-filled host buffer (the Linux runtime does not zero states for us)."""
        return np.zeros(self.shape, dtype=self.numpy_dtype)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": dtype_name(self.dtype),
            "layout": self.layout,
        }


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float16` -> "float16" (the spelling the Core AI runtime reports)."""
    return str(dtype).removeprefix("torch.")


def register_states(module: torch.nn.Module, specs: list[StateSpec]) -> None:
    """Register one zero buffer per spec, in spec order (the converter's state order)."""
    for spec in specs:
        module.register_buffer(spec.name, torch.zeros(spec.shape, dtype=spec.dtype))


def read_layer(buffer: torch.Tensor, i: int) -> torch.Tensor:
    """Layer i's slice `buffer[i]` of a stacked [L, ...] state.

    Taken as a row lookup (`embedding` -> `gather_nd`) on the [L, rest] view: on the Linux
    Core AI runtime a slice or `index_select` (`gather_along_axis`, which walks an index per
    element) is 6-15x slower for the same bytes (benchmarks/state_io.py).
    """
    flat = buffer.reshape(buffer.shape[0], -1)
    return F.embedding(torch.tensor([i]), flat).view(buffer.shape[1:])


def stack_rows(pieces: list[torch.Tensor], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Stack L tensors of equal size as the rows of an [L, numel] tensor.

    Placed with a chain of `index_copy` (scatter_nd) into zeros: on the Linux Core AI runtime
    `torch.stack` / `cat` (concat) is 10-20x slower for the same bytes (benchmarks/state_io.py).
    Each scatter copies the whole [L, numel] tensor, so this is for small rows; a big stacked
    state is better updated as a whole (see RWKV-7's deferred WKV update).
    """
    out = torch.zeros(len(pieces), pieces[0].numel(), dtype=dtype)
    for i, piece in enumerate(pieces):
        out = out.index_copy(0, torch.tensor([i]), piece.reshape(1, -1).to(dtype))
    return out


def read_layer_by_matmul(buffer: torch.Tensor, i: int) -> torch.Tensor:
    """Layer i's slice of a stacked [L, ...] state as `onehot(i) @ buffer.view(L, -1)`.

    Exact (each element is 1*x plus zeros) and, for large per-layer slices, far cheaper on
    the Linux Core AI runtime than `read_layer`: `index_select` becomes a broadcast of the
    index to the slice's size plus an element-wise gather, and a slice copies as slowly. For
    Gated DeltaNet's 786k-float slices (4 layers of the 1.3B geometry) one read + write per
    layer took 148 ms per call with `read_layer` and 56 ms with this (benchmarks/gdn_composite.py
    profile, shared machine). Its cost grows with L x slice: once Gated DeltaNet's decode wrote
    its state as a whole, `read_layer` was faster there (340m: 177 vs 242 ms/token), so no
    built-in uses this today; it stays for benchmarks/gdn_composite.py and plugins.
    """
    layers = buffer.shape[0]
    onehot = torch.zeros(1, layers, dtype=buffer.dtype)
    onehot[0, i] = 1
    return (onehot @ buffer.reshape(layers, -1)).view(buffer.shape[1:])


def write_once(buffer: torch.Tensor, per_layer: list[torch.Tensor]) -> None:
    """Write a stacked [L, ...] state from its L layer slices with a single in-place copy:
    exactly one `write_handle` per state in the exported graph (Apple's GPU delegate keeps one
    write per handle), and far cheaper here than writing slices in place (a chain of
    full-size `where`s)."""
    buffer.copy_(stack_rows(per_layer, buffer.dtype).view(buffer.shape))
