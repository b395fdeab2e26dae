"""The "apple" layout of the generic graph: the functions and states Apple's engines drive.

Over the very blocks of `ssmport.graph.CausalLM` (same weights), two functions:

    main(input_ids int32 [1, T?], position_ids int32 [1, P?]) -> logits fp16 [1, T?, V]
    prefill(input_ids int32 [1, T?], position_ids int32 [1, P?]) -> ()

T dynamic (every row is a real token: no padding, no valid_len), `position_ids` the whole
history 0..P-1 as the engines feed it (the new tokens sit at P-T..P-1), logits of every row
in fp16, and `prefill` the same computation without the head (docs/apple-engines.md, sections 6-8).
Those calls run the blocks' chunk path, so only architectures whose chunk forms are loop-free
and shape-polymorphic in T take this layout.

`main` comes in two forms (`APPLE_MAINS`): "decode" (the default) takes one token, T = 1
static, and runs the blocks' decode path, the very M=1 graph of the ssmport layout: Apple's
engines since the prefill function (#204, #227) send it only the held-back last prompt token
and the decode steps. "chunk" takes [1, T?] through the chunk path, which the 86b363d engines
need (they send whole prompts to `main`), at the price of a heavier decode step.

States: an architecture may split one of its native states into parts (`StateSplit`), so a
pure-recurrent model has three states and Apple's 86b363d rule "exactly two states are a KV
pair" cannot misread it. The graph reassembles each layer's native slice from the parts and
writes each part once.

The states are arguments of `forward` (mutated in place), not buffers, so that a KV cache's
position axis can be dynamic, as in Apple's Qwen3.5 export: keyCache / valueCache
[L_attn, 1, kv_heads, S?, head_dim], S sized by the caller (Apple's engines grow it; the
engines' heuristic takes a state with a dynamic dimension for a KV cache, and a static one
named "...Cache" for a sliding cache, which the pipelined engine refuses). A call writes its
T new rows at positions P-T .. P-1 with one slice update and its attention reads the first P
positions; the caller keeps S >= P (the Core AI runtime clamps a write past S silently).

Ring states (sliding-window layers, ssmport.ops.sliding) are stored as one static state,
slidingCache [L_K + L_V, 1, kv_heads, W, head_dim] (the rows of each ring in turn), so that LFM3
has the four states Apple's engines take at most; it is written by one blend over its W slots
(`sliding.blend`: the converter refuses the default layout's scatter when T is dynamic).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import nn

from ssmport.graph import Step, layer_slots, run_blocks, write_state_values
from ssmport.growing_kv import read_kv_layer
from ssmport.manifest import DYNAMIC_DIM, with_positions
from ssmport.models.layers import SLIDING_CACHE
from ssmport.ops import sliding
from ssmport.ops.conv import ShiftIn
from ssmport.ops.rows import read_layer
from ssmport.state import KV, RING, StateSpec, StateSplit

MAIN, PREFILL = "main", "prefill"
DECODE_MAIN, CHUNK_MAIN = "decode", "chunk"
APPLE_MAINS = (DECODE_MAIN, CHUNK_MAIN)  # the forms of `main`, see above
INPUT_NAMES = ("input_ids", "position_ids")
OUTPUT_NAMES = {MAIN: ("logits",), PREFILL: ()}


def apple_specs(native: Sequence[StateSpec], splits: Sequence[StateSplit]) -> list[StateSpec]:
    """The layout's states: each split native state replaced by its parts, in place; each kv
    state with a dynamic position axis, up to the positions it held natively; the ring states
    as one (`ring_rows`), where the first of them was."""
    by_state = {s.state: s for s in splits}
    rings = [s for s in native if s.kind == RING]
    specs = []
    for spec in native:
        split = by_state.get(spec.name)
        if spec.kind == RING:
            if split is not None:
                raise ValueError(f"ring state {spec.name} cannot be split")
            if spec is rings[0]:
                specs.append(merged_ring(rings))
            continue
        if spec.kind == KV:
            if split is not None:
                raise ValueError(f"kv state {spec.name} cannot be split")
            specs.append(replace(spec, shape=with_positions(spec.shape, DYNAMIC_DIM), max_context=spec.context))
            continue
        if split is None:
            specs.append(spec)
            continue
        slice_shape = list(spec.shape[2:])
        if sum(p.size for p in split.parts) != slice_shape[split.axis]:
            raise ValueError(f"the parts of {spec.name} do not add up to its axis {split.axis}")
        for part in split.parts:
            shape = list(slice_shape)
            shape[split.axis] = part.size
            if part.size == 1:  # a single row is stored without its unit axis
                del shape[split.axis]
            specs.append(StateSpec(part.name, (*spec.shape[:2], *shape), spec.dtype, part.axes, spec.kind))
    return specs


def merged_ring(rings: Sequence[StateSpec]) -> StateSpec:
    """The ring states [L_i, 1, heads, W, d] stacked along their layer axis as one state
    (Apple's engines take at most four states; a static shape named "...Cache" is their sliding
    cache): the rows of the first, then of the next."""
    first = rings[0]
    if any(r.shape[1:] != first.shape[1:] or r.dtype != first.dtype for r in rings):
        raise ValueError(f"ring states {[r.name for r in rings]} differ in shape or dtype")
    rows = ", then ".join(f"{r.name}'s {r.shape[0]}" for r in rings)
    return StateSpec(SLIDING_CACHE, (sum(r.shape[0] for r in rings), *first.shape[1:]), first.dtype,
                     f"[ring row ({rows}), batch, kv head, slot (position mod window), head_dim]", RING)  # fmt: skip


def ring_rows(native: Sequence[StateSpec]) -> dict[str, int]:
    """Where each ring state's rows start in the merged one."""
    rows, first = {}, 0
    for spec in native:
        if spec.kind == RING:
            rows[spec.name], first = first, first + spec.shape[0]
    return rows


class AppleLM(nn.Module):
    """`main` (with_head) or `prefill` (without) of the apple layout, over a decode module's
    embedding, blocks and head (`ssmport.graph.CausalLM`), whose native states it stores as
    `splits` say. `one_token`: T = 1 through the blocks' decode path (the "decode" main)."""

    def __init__(self, decode: nn.Module, splits: Sequence[StateSplit], with_head: bool, max_rows: int,
                 one_token: bool = False):  # fmt: skip
        super().__init__()
        self.embed, self.layers, self.head, self.with_head = decode.embed, decode.layers, decode.head, with_head
        self.one_token = one_token
        self.max_rows = 1 if one_token else max_rows  # the most tokens one call may carry (the bound on T)
        self.native = tuple(decode.specs)
        self.splits = {s.state: s for s in splits}
        self.specs = tuple(apple_specs(self.native, splits))
        self.dynamic = frozenset(s.name for s in self.specs if s.dynamic)  # the growing KV caches
        self.ring_rows = ring_rows(self.native)  # native ring -> its first row in SLIDING_CACHE
        self.slots = layer_slots(self.layers, self.native)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, states: tuple[torch.Tensor, ...]):
        """`states`: one tensor per spec, in order, updated in place."""
        T, P = input_ids.shape[1], position_ids.shape[1]
        torch._check(P >= T)
        bound = dict(zip((s.name for s in self.specs), states))
        for name in self.dynamic:
            torch._check(P <= bound[name].shape[3])
        positions = torch.arange(T, dtype=torch.int32) + (P - T)
        if self.one_token:
            step = Step(None, positions)
        else:
            valid_len = torch.ones(T, dtype=torch.int32).sum().view(1)  # every row is real (T, as a tensor)
            step = Step(valid_len, positions, max_rows=self.max_rows)
        x = run_blocks(self.layers, self.slots, self.native, self.embed(input_ids.view(T)), step,
                       _ArgumentStates(self, bound, P, T))  # fmt: skip
        if not self.with_head:
            return ()
        return self.head(x).to(torch.float16).view(1, T, -1)

    def example_states(self, positions: int) -> tuple[torch.Tensor, ...]:
        """Zero states to trace with, a dynamic position axis at `positions`."""
        return tuple(torch.zeros(with_positions(s.shape, positions) if s.dynamic else s.shape, dtype=s.dtype)
                     for s in self.specs)  # fmt: skip


class _ArgumentStates:
    """The apple layout's state I/O for `run_blocks`: the states are `forward`'s arguments,
    split native states stored as their parts, KV caches with a growing position axis."""

    def __init__(self, lm: AppleLM, bound: dict[str, torch.Tensor], positions, rows):
        self.lm, self.bound, self.positions, self.rows = lm, bound, positions, rows
        self.by_name = {s.name: s for s in lm.specs}
        self.ring_values: list[torch.Tensor] = []  # the ring states' rows, until the last is given

    def read_state(self, name: str, slot: int, flat: bool = False) -> torch.Tensor:
        split, bound = self.lm.splits.get(name), self.bound
        if name in self.lm.ring_rows:
            return read_layer(bound[SLIDING_CACHE], self.lm.ring_rows[name] + slot, flat)[0]
        if split is None:
            # a growing KV cache is read whole, all S positions (attention masks those at or past
            # the token's own): a row lookup, where the slice of its first P positions cost
            # ~8 ms each at S = 512 here (benchmarks/README.md, "Decode cost follows the tokens held")
            if name in self.lm.dynamic:
                return read_kv_layer(bound[name], slot)
            return read_layer(bound[name], slot, flat)[0]
        pieces = []
        for part in split.parts:
            # a part of one row reads flat: gathered, its unit axes cost RWKV-7's shiftState 2
            # reshapes a decode call (benchmarks/graph_diff.py --layout apple)
            piece = read_layer(bound[part.name], slot, flat or part.size == 1)[0]
            pieces.append(piece.unsqueeze(split.axis) if part.size == 1 else piece)
        return torch.cat(pieces, dim=split.axis)

    def write_state(self, spec: StateSpec, values: list, step: Step) -> None:
        split, bound = self.lm.splits.get(spec.name), self.bound
        if spec.kind == RING:  # every ring's rows in one blend, once the last ring's are in
            self.ring_values += [v.rows for v in values]
            if len(self.ring_values) == bound[SLIDING_CACHE].shape[0]:
                sliding.blend(bound[SLIDING_CACHE], self.ring_values, step.positions, step.valid_len)
        elif self.by_name.get(spec.name, spec).dynamic:
            _write_positions(bound[spec.name], [v.rows for v in values], self.positions - self.rows)
        elif split is None:
            write_state_values(bound[spec.name], spec, values, step)
        else:
            for part, pieces in zip(split.parts, _split_values(values, split)):
                write_state_values(bound[part.name], self.by_name[part.name], pieces, step)


def _write_positions(cache: torch.Tensor, rows: list[torch.Tensor], start) -> None:
    """Every layer's new rows [heads, T, d] into the cache [L, 1, heads, S?, d] at positions
    start .. start+T-1, in one slice update (a scatter, `index_copy`, is refused by the
    converter on a dynamic axis; the stack is a concat of the layers' few rows)."""
    L, _, heads, _, d = cache.shape
    T = rows[0].shape[1]
    stacked = torch.stack(rows).view(L, 1, heads, T, d).to(cache.dtype)
    cache[:, :, :, start : start + T] = stacked


def _split_values(values: list, split: StateSplit) -> list[list]:
    """Each layer's native value (a slice, or a tuple of rows along axis 0) as one value per part."""
    per_part: list[list] = [[] for _ in split.parts]
    for value in values:
        if isinstance(value, ShiftIn):  # a decode step's conv row: split along its channels as the past would be
            for j, piece in enumerate(value.row.split([p.size for p in split.parts], dim=split.axis)):
                per_part[j].append(ShiftIn(piece))
        elif isinstance(value, tuple):  # rows: part j takes the next `size` of them
            if split.axis != 0:
                raise ValueError(f"{split.state}: rows can only be split along axis 0")
            start = 0
            for j, part in enumerate(split.parts):
                rows = value[start : start + part.size]
                per_part[j].append(rows[0] if part.size == 1 else rows)
                start += part.size
        else:
            for j, piece in enumerate(value.split([p.size for p in split.parts], dim=split.axis)):
                per_part[j].append(piece.squeeze(split.axis) if split.parts[j].size == 1 else piece)
    return per_part
