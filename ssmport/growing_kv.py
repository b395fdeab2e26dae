"""The ssmport layout's functions with growing KV caches: decode cost that follows the tokens held.

A static KV cache [L, 1, heads, context, head_dim] costs every call the whole allocation on
this runtime, however few tokens it holds: the masked attention reads every position, and
the one-row write (a scatter) copies the whole state twice (the scatter's output, then the
state write). Measured on an LFM2-350M-shaped fp32 bundle (benchmarks/README.md, "Decode cost
follows the tokens held"): 63 ms/token at --context 512, 225 at 4096.

So a hybrid's KV caches get a dynamic position axis S, as in the apple layout and Apple's
own exports: the runner allocates S = 256 positions and doubles it as the tokens need
(ssmport.runtime.kv_growth), never past --context, and every call reads and writes S
positions, not the context. The functions keep the ssmport layout's interface (one-token
`main`, padded `prefill` chunks with valid_len); the states become `forward` arguments
(buffers cannot have a dynamic axis). A layer's cache slice is read whole ([heads, S, d],
a row lookup) and attention masks positions at or past the token's own, as before; the new
rows are blended in at their positions by one `where` over the cache (a scatter on a dynamic
axis is refused by the converter), a chunk's rows first gathered to the positions they land on.

A sliding-window ring [L, 1, heads, W, d] (ssmport.ops.sliding) grows the same way, its slot
axis dynamic up to W (the runner allocates it like a KV cache, capped at the window): a call
attends over and blends into the slots allocated, not all W, while fewer than W positions were
written (RecurrentGemma-2B: all 2,048 slots cost ~3.6 ms of an attention layer's ~19 ms at short
history, benchmarks/README.md). The apple layout's rings stay static: Apple's engines take every
state with a dynamic axis for a positional KV cache (ssmport.apple.state_kinds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import nn

from ssmport.graph import Step, layer_slots, run_blocks, write_state_values
from ssmport.manifest import DYNAMIC_DIM, with_positions
from ssmport.ops.rows import blend_at, last_valid, read_layer
from ssmport.ops import sliding
from ssmport.state import KV, RING, StateSpec

TRACE_POSITIONS = 16  # the KV caches' positions in the tracing example (more than any traced position)
# A ring's slots in the tracing example: not the KV caches' count, which torch.export would take
# for one size (duck sizing) and then refuse the two dims as distinct.
TRACE_SLOTS = 12
MIN_POSITIONS = 2  # torch.export specialises sizes 0 and 1


def _grows(s: StateSpec) -> bool:
    """A kv state grows; a ring does while its window can (a window of 1 or 2 slots stays static)."""
    return s.kind == KV or (s.kind == RING and s.shape[3] > MIN_POSITIONS)


def growing_specs(native: Sequence[StateSpec]) -> list[StateSpec]:
    """The states with each kv state's position axis dynamic, up to the positions it held, and
    each ring's slot axis, up to its window."""
    return [replace(s, shape=with_positions(s.shape, DYNAMIC_DIM), max_context=s.context or s.window) if _grows(s)
            else s for s in native]  # fmt: skip


def grows(specs: Sequence[StateSpec]) -> bool:
    """Whether a model's functions take growing states (it has a kv state or a ring)."""
    return any(_grows(s) for s in specs)


class GrowingKVLM(nn.Module):
    """`main` (chunk None) or `prefill` (chunk T) of the ssmport layout over a `CausalLM`'s
    embedding, blocks and head, the states passed as arguments (updated in place), the kv
    states with a dynamic position axis.

        main(input_ids [1, 1], position_ids [1, 1], states) -> logits [1, 1, V]
        prefill(input_ids [1, T], position_ids [1, T], valid_len [1], states) -> logits
    """

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.embed, self.layers, self.head = lm.embed, lm.layers, lm.head
        self.chunk, self.all_logits = lm.chunk, lm.all_logits
        self.native = tuple(lm.specs)
        self.specs = tuple(growing_specs(self.native))
        self.slots = layer_slots(self.layers, self.native)
        self.grown = frozenset(s.name for s in self.specs if s.dynamic)  # the kv states and the rings
        # with a draft head (ssmport.models.qwen3_5.mtp): a second output, "hidden", every row's
        # final-norm output [1, T, C] (main: [1, 1, C]), what the head drafts from
        self.hidden = False

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, third, fourth=None):
        # (valid_len, states) for prefill, (states,) for main: named arguments, not *args,
        # which torch.export would take as one more nesting level
        valid_len, states = (third, fourth) if self.chunk else (None, third)
        T = self.chunk or 1
        step = Step(valid_len, position_ids.view(T))
        io = _GrowingStates(dict(zip((s.name for s in self.specs), states)), self.grown)
        x = run_blocks(self.layers, self.slots, self.native, self.embed(input_ids.view(T)), step, io)
        if self.hidden:
            normed = self.head.normed(x)
            rows = normed if step.decode or self.all_logits else last_valid(normed, step.valid_len)
            return self.head.proj(rows).view(1, rows.shape[0], -1), normed.view(1, T, -1)
        if step.decode or not self.all_logits:
            x = x if step.decode else last_valid(x, step.valid_len)
            return self.head(x).view(1, 1, -1)
        return self.head(x).view(1, T, -1)

    def example(self) -> tuple[tuple, tuple]:
        """Tracing inputs and torch.export's dynamic shapes: each kv state's positions S dynamic
        (traced at TRACE_POSITIONS) up to its context, each ring's slots R up to its window (one
        dim per window)."""
        T = self.chunk or 1
        ids = (torch.zeros(1, T, dtype=torch.int32), torch.zeros(1, T, dtype=torch.int32))
        inputs = ids + ((torch.ones(1, dtype=torch.int32),) if self.chunk else ())
        kv = [s.max_context for s in self.specs if s.dynamic and s.kind == KV]
        dims = {KV: torch.export.Dim("S", min=MIN_POSITIONS, max=min(kv))} if kv else {}
        for w in sorted({s.window for s in self.specs if s.dynamic and s.kind == RING}):
            dims[w] = torch.export.Dim(f"R{w}", min=MIN_POSITIONS, max=w)
        key = {s.name: (KV if s.kind == KV else s.window) for s in self.specs if s.dynamic}
        traced = {KV: TRACE_POSITIONS} | {w: min(TRACE_SLOTS, w) for w in dims if w != KV}
        states = tuple(torch.zeros(with_positions(s.shape, traced[key[s.name]]) if s.dynamic else s.shape,
                                   dtype=s.dtype) for s in self.specs)  # fmt: skip
        shapes = tuple({3: dims[key[s.name]]} if s.dynamic else None for s in self.specs)
        return inputs + (states,), (None,) * len(inputs) + (shapes,)


class _GrowingStates:
    """`run_blocks`' state I/O over the argument states: a kv state's or ring's layer slice read
    whole (all S positions or slots; attention masks the ones not yet written), its new rows
    blended in."""

    def __init__(self, bound: dict[str, torch.Tensor], grown: frozenset[str]):
        self.bound, self.grown = bound, grown

    def read_state(self, name: str, slot: int, flat: bool = False) -> torch.Tensor:
        return read_kv_layer(self.bound[name], slot) if name in self.grown else read_layer(self.bound[name], slot, flat)[0]

    def write_state(self, spec: StateSpec, values: list, step: Step) -> None:
        if spec.kind == KV:
            blend_rows(self.bound[spec.name], [v.rows for v in values], step)
        elif spec.name in self.grown:  # a growing ring (a scatter on its dynamic axis is refused)
            sliding.blend(self.bound[spec.name], [v.rows for v in values], step.positions, step.valid_len, spec.window)
        else:
            write_state_values(self.bound[spec.name], spec, values, step)


def read_kv_layer(cache: torch.Tensor, slot: int) -> torch.Tensor:
    """Layer `slot`'s [heads, S, d] of a growing cache [L, 1, heads, S, d]: `read_layer`'s gather
    on the cache as it is, viewed to its shape (indexing away the unit axis is a `slice` +
    `shrink_dims` on a dynamic shape here, ~2 ms each at S = 256 on an LFM2-350M layer; the row
    lookup on the [L, rest] view reshaped, so copied, the whole cache every call)."""
    return read_layer(cache, slot).view(cache.shape[2:])


def blend_rows(cache: torch.Tensor, rows: list[torch.Tensor], step: Step) -> None:
    """Every layer's new rows [heads, T, d] into the cache [L, 1, heads, S, d] at the rows'
    positions (consecutive from step.positions[0]; a chunk's rows >= valid_len are padding and
    not written), blended in over the whole cache (ssmport.ops.rows.blend_at). A position >= S
    writes nothing (the runner grows S first)."""
    S = cache.shape[3]
    if step.decode:
        blend_at(cache, rows, torch.arange(S) == step.positions.long().view(1), None)
    else:
        offset = torch.arange(S) - step.positions[0:1].long()  # [S]: row of the chunk landing at each position
        blend_at(cache, rows, (offset >= 0) & (offset < step.valid_len.long()), offset)


def blend_rows_naive(cache: torch.Tensor, rows: list[torch.Tensor], positions: torch.Tensor, valid: int) -> None:
    """The readable form: layer l's row t into cache[l, 0, :, positions[t]] for t < valid."""
    for layer, r in enumerate(rows):
        for t in range(valid):
            if positions[t] < cache.shape[3]:
                cache[layer, 0, :, int(positions[t])] = r[:, t].to(cache.dtype)


__all__ = ["GrowingKVLM", "blend_rows", "blend_rows_naive", "grows", "growing_specs", "read_kv_layer"]
