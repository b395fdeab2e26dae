"""Typed, named recurrent state.

A Core AI state is a buffer the graph mutates in place. Each architecture declares its
states once, as `StateSpec`s, in a fixed order; the exporter, the runner, the manifest and
the tests all read that one declaration.

Apple's GPU delegate keeps only one write per state handle, so a call must write each state
exactly once: layers *return* their new slices (or updates) and the graph (ssmport.graph) turns
them into a single in-place write per state.

Three kinds: "fixed" states (recurrent: conv windows, WKV / SSM / delta-rule matrices), whose size
does not depend on the sequence; "kv" states, a positional cache
[L_kind, 1, heads, context, head_dim] written at each token's position and read up to it; and
"ring" states, a sliding-window cache [L_kind, 1, heads, window, head_dim] written at slot
position mod window and read under a mask built from the positions (ssmport.ops.sliding): a
constant size, whatever the context.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ssmport.errors import SsmportError
from ssmport.manifest import DYNAMIC_DIM, FIXED, KINDS, KV, RING, with_positions

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
    kind: str = FIXED  # FIXED (recurrent: conv, wkv, ssm) | KV (positional cache) | RING (sliding window)
    # A kv state whose position axis is dynamic (DYNAMIC_DIM: each caller sizes the buffer, as
    # Apple's engines grow their KV caches): the most positions it may hold.
    max_context: int | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"state {self.name}: kind must be one of {KINDS}, not {self.kind!r}")
        if self.kind == KV and len(self.shape) != 5:
            raise ValueError(f"kv state {self.name} must be [layers, 1, heads, context, head_dim], got {self.shape}")
        if self.kind == RING and (len(self.shape) != 5 or self.shape[1] != 1 or min(self.shape) < 1):
            raise ValueError(f"ring state {self.name} must be [layers, 1, heads, window, head_dim], got {self.shape}")
        dynamic = [i for i, d in enumerate(self.shape) if d == DYNAMIC_DIM]
        if dynamic not in ([], [3]) or (dynamic and self.kind != KV) or bool(dynamic) != (self.max_context is not None):
            raise ValueError(f"state {self.name}: only a kv state's position axis may be dynamic, with a max_context")

    @property
    def dynamic(self) -> bool:
        """Whether the position axis is dynamic (the caller sizes it, up to max_context)."""
        return self.max_context is not None

    @property
    def context(self) -> int | None:
        """The positions a kv state holds (None for a fixed state)."""
        if self.kind != KV:
            return None
        return self.max_context if self.dynamic else self.shape[3]

    @property
    def window(self) -> int | None:
        """The positions a ring state keeps (None for the other kinds)."""
        return self.shape[3] if self.kind == RING else None

    @property
    def full_shape(self) -> tuple[int, ...]:
        """The shape of a buffer holding the whole context (a fixed state's own shape)."""
        return with_positions(self.shape, self.context) if self.dynamic else self.shape

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
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": dtype_name(self.dtype),
            "layout": self.layout,
            "kind": self.kind,
        } | ({} if self.max_context is None else {"max_context": self.max_context})


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


@dataclass(frozen=True)
class StatePart:
    name: str
    size: int  # its extent along the split axis of the native layer slice
    layout: str


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

