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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from ssmport.graph import Step, layer_slots, run_blocks, write_state_values
from ssmport.manifest import DYNAMIC_DIM, with_positions
from ssmport.ops.rows import blend_at, last_valid, read_layer
from ssmport.state import KV, StateSpec

TRACE_POSITIONS = 16  # the KV caches' positions in the tracing example (more than any traced position)
MIN_POSITIONS = 2  # torch.export specialises sizes 0 and 1


def growing_specs(native: Sequence[StateSpec]) -> list[StateSpec]:
    """The states with each kv state's position axis dynamic, up to the positions it held."""
    return [replace(s, shape=with_positions(s.shape, DYNAMIC_DIM), max_context=s.context) if s.kind == KV else s
            for s in native]  # fmt: skip


def grows(specs: Sequence[StateSpec]) -> bool:
    """Whether a model's functions take growing KV caches (it has a kv state)."""
    return any(s.kind == KV for s in specs)


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
        self.kv = frozenset(s.name for s in self.specs if s.dynamic)
        # with a draft head (ssmport.models.qwen3_5.mtp): a second output, "hidden", every row's
        # final-norm output [1, T, C] (main: [1, 1, C]), what the head drafts from
        self.hidden = False

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, third, fourth=None):
        # (valid_len, states) for prefill, (states,) for main: named arguments, not *args,
        # which torch.export would take as one more nesting level
        valid_len, states = (third, fourth) if self.chunk else (None, third)
        T = self.chunk or 1
        step = Step(valid_len, position_ids.view(T))
        io = _GrowingStates(dict(zip((s.name for s in self.specs), states)), self.kv)
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
        (traced at TRACE_POSITIONS) up to its context."""
        T = self.chunk or 1
        ids = (torch.zeros(1, T, dtype=torch.int32), torch.zeros(1, T, dtype=torch.int32))
        inputs = ids + ((torch.ones(1, dtype=torch.int32),) if self.chunk else ())
        states = tuple(torch.zeros(with_positions(s.shape, TRACE_POSITIONS) if s.dynamic else s.shape, dtype=s.dtype)
                       for s in self.specs)  # fmt: skip
        context = min(s.max_context for s in self.specs if s.dynamic)
        S = torch.export.Dim("S", min=MIN_POSITIONS, max=context)
        shapes = tuple({3: S} if s.dynamic else None for s in self.specs)
        return inputs + (states,), (None,) * len(inputs) + (shapes,)


class _GrowingStates:
    """`run_blocks`' state I/O over the argument states: a kv state's layer slice read whole
    (all S positions; attention masks the ones not yet written), its new rows blended in."""

    def __init__(self, bound: dict[str, torch.Tensor], kv: frozenset[str]):
        self.bound, self.kv = bound, kv

    def read_state(self, name: str, slot: int) -> torch.Tensor:
        return read_kv_layer(self.bound[name], slot) if name in self.kv else read_layer(self.bound[name], slot)[0]

    def write_state(self, spec: StateSpec, values: list, step: Step) -> None:
        if spec.kind == KV:
            blend_rows(self.bound[spec.name], [v.rows for v in values], step)
        else:
            write_state_values(self.bound[spec.name], spec, values, step)


def read_kv_layer(cache: torch.Tensor, slot: int) -> torch.Tensor:
    """Layer `slot`'s [heads, S, d] of a growing cache [L, 1, heads, S, d]: a row lookup viewed
    to its shape (indexing away the unit axis is a `slice` + `shrink_dims` on a dynamic shape
    here, ~2 ms each at S = 256 on an LFM2-350M layer)."""
    L, _, heads, S, d = cache.shape
    return F.embedding(torch.tensor([slot]), cache.reshape(L, -1)).view(heads, S, d)


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
