"""One generic causal LM for every architecture: embed -> blocks -> head, each state written once.

An architecture supplies its blocks (one per layer), an embedding and a head (final norm + LM
head). A block reads the slices of the stacked states it uses and returns what each becomes:

    block(x [T, C], slices {state: its slice}, step) -> (x, {state: value})

where a value is
- the new slice (a tensor), or a tuple of rows that together are the slice (stacked without a
  concat: RWKV-7's two token-shift rows);
- a `StateUpdate` (ssmport.ops.deferred): decode's deferred update, applied to the whole state;
- `KVRows`: the new rows of a positional ("kv") state, written at the tokens' positions;
- `RingRows`: the new rows of a sliding-window ("ring") state, written at slot position mod
  window (ssmport.ops.sliding).

`CausalLM` gathers the values of every layer into one write per state, for decode (T = 1,
`valid_len` None) and for chunked prefill (T = chunk, `valid_len` the real tokens), over the
same blocks: the decode and prefill functions share every weight. Which layers use which state
(their slot in its stack) follows from the blocks' `states`, so a hybrid's attention layers
stack into the KV states and its recurrent layers into theirs. A block may also name, in
`flat_reads`, states whose decode slice is read as a row of the state's [L, rest] view, as
every prefill slice is (ssmport.ops.rows.read_layer says when that is better).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from ssmport.ops import conv, deferred, sliding
from ssmport.ops.norms import layer_norm, rms_norm
from ssmport.ops.rows import last_valid, read_layer, stack_rows, write_once
from ssmport.state import StateSpec, register_states


@dataclass
class Step:
    """What a block knows of the call it runs in."""

    valid_len: torch.Tensor | None  # None: decode, one token; else int32 [1], the real rows of a chunk
    positions: torch.Tensor  # int32 [T]: each row's position in the sequence
    carry: dict[str, Any] = field(default_factory=dict)  # values handed from block to block (v_first)
    max_rows: int | None = None  # when T is symbolic (a dynamic-shape export): its upper bound

    @property
    def decode(self) -> bool:
        return self.valid_len is None


class KVRows(NamedTuple):
    """A block's new rows of a kv state, [heads, T, head_dim]: written at the rows' positions."""

    rows: torch.Tensor


class RingRows(NamedTuple):
    """A block's new rows of a ring state, [heads, T, head_dim]: written at their ring slots."""

    rows: torch.Tensor


class Embedding(nn.Module):
    """Rows of a lookup table as fp32: a float Parameter, or a module whose `rows(ids)` reads
    them (`ops.matmul.QuantizedTable`, or `auto`'s sensitivity probe)."""

    def __init__(self, table: nn.Parameter | nn.Module):
        super().__init__()
        self.weight = table

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if isinstance(self.weight, nn.Module):
            return self.weight.rows(ids)
        return F.embedding(ids, self.weight).float()


class NormHead(nn.Module):
    """The final norm and the LM head: rows x [R, C] -> logits [R, V]."""

    def __init__(self, proj: nn.Module, weight: nn.Parameter, eps: float, bias: nn.Parameter | None = None):
        super().__init__()
        self.proj, self.weight, self.bias, self.eps = proj, weight, bias, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.normed(x))

    def normed(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm alone: the rows the LM head reads (a draft head's input hidden state)."""
        if self.bias is not None:
            return layer_norm(x, self.weight, self.bias, self.eps)
        return rms_norm(x, self.weight, self.eps)


class CausalLM(nn.Module):
    """(input_ids int32 [1, T], position_ids int32 [1, T][, valid_len int32 [1]]) -> logits.

    `chunk` None: the decode function (T = 1). Otherwise the prefill function for chunks of
    `chunk` tokens: rows >= valid_len are padding and never reach a state; the logits are
    those of row valid_len-1 ([1, 1, V]), or of every row with `all_logits` ([1, T, V]).
    """

    def __init__(
        self,
        embed: nn.Module,
        blocks: Sequence[nn.Module],
        head: nn.Module,
        specs: Sequence[StateSpec],
        chunk: int | None = None,
        all_logits: bool = False,
    ):
        super().__init__()
        # A prefill built on a decode module takes its very ModuleList: the same weights, stored once.
        self.embed, self.head = embed, head
        self.layers = blocks if isinstance(blocks, nn.ModuleList) else nn.ModuleList(blocks)
        self.specs, self.chunk, self.all_logits = tuple(specs), chunk, all_logits
        register_states(self, list(specs))
        self.slots = layer_slots(self.layers, self.specs)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, valid_len: torch.Tensor | None = None):
        T = self.chunk or 1
        step = Step(valid_len if self.chunk else None, position_ids.view(T))
        x = self.run_blocks(self.embed(input_ids.view(T)), step)
        if step.decode or not self.all_logits:
            x = x if step.decode else last_valid(x, step.valid_len)
            return self.head(x).view(1, 1, -1)
        return self.head(x).view(1, T, -1)

    def run_blocks(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        """Every block over the rows x [T, C], then one write per state; the new rows.
        (The gate's layer-streamed reference runs a few blocks at a time through this.)"""
        return run_blocks(self.layers, self.slots, self.specs, x, step, self)

    # The default state I/O (`StateIO`): the states are this module's buffers.
    def read_state(self, name: str, slot: int, flat: bool = False) -> torch.Tensor:
        return read_layer(getattr(self, name), slot, flat)[0]

    def write_state(self, spec: StateSpec, values: list, step: Step) -> None:
        write_state_values(getattr(self, spec.name), spec, values, step)


class StateIO(Protocol):
    """Where `run_blocks` reads a layer's state slices and writes every layer's new values:
    a `CausalLM`'s own buffers, or a bundle layout's state arguments (ssmport.apple.graph)."""

    def read_state(self, name: str, slot: int, flat: bool = False) -> torch.Tensor:
        """Layer `slot`'s slice of state `name`; `flat`: read as a row of its [L, rest] view
        (ssmport.ops.rows.read_layer)."""
        ...

    def write_state(self, spec: StateSpec, values: list, step: Step) -> None: ...


def run_blocks(
    layers: nn.ModuleList, slots: list[dict[str, int]], specs: Sequence[StateSpec], x: torch.Tensor, step: Step,
    io: StateIO,
) -> torch.Tensor:  # fmt: skip
    """The one graph driver: every block over the rows x [T, C], reading each layer's state
    slices from `io`, then one `io.write_state` per state (in `specs` order); the new rows."""
    values: dict[str, list] = {s.name: [] for s in specs}
    for layer, used in zip(layers, slots):
        # A chunk reads every slice flat: its one whole-state reshape is paid once per chunk,
        # where the gather's unit axes cost the chunk form a reshape a layer (+19 kernels at
        # gated-deltanet-340m).
        flat = getattr(layer, "flat_reads", ())
        slices = {name: io.read_state(name, slot, not step.decode or name in flat) for name, slot in used.items()}
        x, new = layer(x, slices, step)
        if set(new) != set(used):
            raise ValueError(f"{type(layer).__name__} returned states {sorted(new)}, declared {sorted(used)}")
        for name, value in new.items():
            values[name].append(value)
    for spec in specs:
        io.write_state(spec, values[spec.name], step)
    return x


def layer_slots(layers: nn.ModuleList, specs: Sequence[StateSpec]) -> list[dict[str, int]]:
    """For each layer, its slot in the stack of every state it uses (the how-many-th user)."""
    count = {s.name: 0 for s in specs}
    slots = []
    for layer in layers:
        unknown = [n for n in layer.states if n not in count]
        if unknown:
            raise ValueError(f"{type(layer).__name__} uses undeclared state(s) {unknown}")
        slots.append({n: count[n] for n in layer.states})
        for n in layer.states:
            count[n] += 1
    for spec in specs:
        if count[spec.name] != spec.shape[0]:
            raise ValueError(f"state {spec.name} stacks {spec.shape[0]} layers but {count[spec.name]} use it")
    return slots


def write_state_values(buffer: torch.Tensor, spec: StateSpec, values: list, step: Step) -> None:
    """One write of a state from every layer's value (all the same kind)."""
    first = values[0]
    if isinstance(first, deferred.StateUpdate):
        deferred.apply(buffer, values)
    elif isinstance(first, KVRows):
        _write_kv(buffer, [v.rows for v in values], step)
    elif isinstance(first, conv.ShiftIn):
        conv.shift_in(buffer, [v.row for v in values])
    elif isinstance(first, RingRows):
        sliding.write(buffer, [v.rows for v in values], step.positions, step.valid_len)
    else:
        rows = [r for v in values for r in (v if isinstance(v, tuple) else (v,))]
        write_once(buffer, rows)


def _write_kv(buffer: torch.Tensor, rows: list[torch.Tensor], step: Step) -> None:
    """Scatter every layer's new rows [heads, T, d] into the cache [L, 1, heads, context, d]
    at the rows' positions, in one `index_copy`. A chunk's padding rows repeat its last real
    row at that row's position (the same value twice, so the write stays exact and in range);
    positions are clamped to the cache so a caller that feeds past it cannot write outside it
    (the runner refuses that before it happens)."""
    L, _, heads, context, d = buffer.shape
    T = rows[0].shape[1]
    stacked = stack_rows(rows).view(L, 1, heads, T, d)
    source = torch.arange(T)
    if not step.decode:
        source = source.clamp(max=step.valid_len.long() - 1)
        stacked = stacked.index_select(3, source)
    where = step.positions.long().index_select(0, source).clamp(0, context - 1)
    buffer.index_copy_(3, where, stacked.to(buffer.dtype))

