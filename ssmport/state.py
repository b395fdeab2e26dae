"""Typed, named recurrent state.

A Core AI state is a buffer the graph mutates in place. Each architecture declares its
states once, as `StateSpec`s, in a fixed order; the exporter, the runner, the manifest and
the tests all read that one declaration.

Apple's GPU delegate keeps only one write per state handle, so a call must write each state
exactly once: layers *return* their new slices (or updates) and the graph (ssmport.graph) turns
them into a single in-place write per state.

Three kinds (ssmport.manifest's FIXED, KV, RING): "fixed" states (recurrent: conv windows, WKV / SSM / delta-rule matrices), whose size
does not depend on the sequence; "kv" states, a positional cache
[L_kind, 1, heads, context, head_dim] written at each token's position and read up to it; and
"ring" states, a sliding-window cache [L_kind, 1, heads, window, head_dim] written at slot
position mod window and read under a mask built from the positions (ssmport.ops.sliding): a
constant size, whatever the context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ssmport.errors import SsmportError
from ssmport.manifest import FIXED, KV, RING, StateEntry

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
class StateSpec(StateEntry):
    """One Core AI state as an architecture declares it: a manifest's StateEntry (name, shape,
    axis legend, kind, max_context and the rule they meet, ssmport.manifest.state_problem)
    whose dtype is the torch dtype the graph stores it in."""

    dtype: torch.dtype  # (a StateEntry's is the dtype's name; `entry()` converts)
    axes: str  # human-readable axis legend, e.g. "[layer, batch, head, key, value]"

    def entry(self, shape: tuple[int, ...] | None = None) -> StateEntry:
        """This state as a manifest records it (`shape`: as the converted IR reports it)."""
        return StateEntry(self.name, self.shape if shape is None else shape, dtype_name(self.dtype), self.axes,
                          self.kind, self.max_context)  # fmt: skip

    @property
    def key(self) -> tuple[str, tuple[int, ...], str]:
        return self.entry().key

    @property
    def numpy_dtype(self) -> np.dtype:
        return NUMPY_DTYPES[self.dtype]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.full_shape)) * self.numpy_dtype.itemsize

    def zeros(self) -> np.ndarray:
        """A zero-filled host buffer (the Linux runtime does not zero states for us)."""
        return np.zeros(self.full_shape, dtype=self.numpy_dtype)

    def to_json(self) -> dict:
        return self.entry().to_json()


def check_room(held: int, new: int, context: int | None) -> None:
    """A model with kv states holds `context` positions: refuse to feed past them (never a
    silent wrap). `context` None: no kv state, any length."""
    if context is not None and held + new > context:
        raise SsmportError(
            f"the context is full: {held} tokens held + {new} new > {context} positions "
            "(export with a larger --context, or start over)"
        )


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float16` -> "float16" (the spelling the Core AI runtime reports)."""
    return str(dtype).removeprefix("torch.")


def register_states(module: torch.nn.Module, specs: list[StateSpec]) -> None:
    """Register one zero buffer per spec, in spec order (the converter's state order)."""
    for spec in specs:
        module.register_buffer(spec.name, torch.zeros(spec.shape, dtype=spec.dtype))


def zero_states(module: torch.nn.Module, specs: Sequence[StateSpec]) -> None:
    """Zero the state buffers `specs` names, and nothing else: a module's other buffers include
    its integer weights (coreai-torch's dequantization keeps levels and scales as buffers)."""
    for spec in specs:
        getattr(module, spec.name).zero_()


@dataclass(frozen=True)
class StatePart:
    name: str
    size: int  # its extent along the split axis of the native layer slice
    axes: str  # its axis legend


@dataclass(frozen=True)
class StateSplit:
    """A native state a bundle layout stores as parts (the apple layout, ssmport.apple.graph):
    its layer slice (without the leading [L, 1]) is the concatenation of the parts' slices
    along `axis`. Architectures declare theirs in `Architecture.apple_state_splits`."""

    state: str
    axis: int
    parts: tuple[StatePart, ...]


__all__ = ["FIXED", "KV", "NUMPY_DTYPES", "RING", "STATE_DTYPES", "StatePart", "StateSpec", "StateSplit", "check_room",
           "dtype_name", "register_states"]  # fmt: skip

