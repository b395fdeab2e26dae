"""`--quant auto --size-budget SIZE`: each matmul's stored form chosen by measurement.

1. Sensitivity. The fp32 decode module is built once, with every matmul (and expert stack) a
   `_Probe` that can be lowered in place. Each candidate alone is lowered to each stored form
   (fp16, int8, int4, and uint4: int4 with a zero point, measured but not chosen, see
   CHOOSE_ZERO_POINTS) while every other weight stays fp32,
   and the calibration streams (the gate's: its built-in texts through the tokenizer, else its
   seeded ids) are run teacher-forced in torch with fp32 sums: the error of that form of that
   tensor alone, mean squared Δlogits against the fp32 logits (squared errors of independent
   perturbations add, so a plan's error is estimated as their sum).
2. Choice. From every candidate at fp16, the lowering that costs the least added error per
   byte saved is taken, again and again, until the plan fits the budget; then, while bytes are
   left, the raise that removes the most error per byte added and still fits. Ties go by name:
   the same model and budget give the same plan.
3. Bytes are exact: each form's bytes are what the plan records for it (4-bit two to a byte,
   scales, zero points), tables fp16 and per-channel vectors fp32 as in every 16-bit recipe.
   A tied model's LM head and table (the head's weight exactly the table transposed) are one
   choice: every pair of their own forms, and the table read from the int8 head (`SHARED`:
   the int8 head's bytes alone, the error of both at int8, which are the same values).
   The asset adds its graph and container; the plan reserves `reserve` bytes for them and the
   exporter checks the asset it wrote against the budget.

A model with more than `MAX_TENSOR_GROUPS` candidates is measured per role (all of a role's
tensors lowered together, one choice per role): the passes then stay a few dozen.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch import nn

from ssmport.errors import SsmportError
from ssmport.graph import Embedding
from ssmport.ops.matmul import ExpertStack
from ssmport.quant.blockwise import dequantize_blockwise, quantize_blockwise
from ssmport.quant.plan import WeightBuilder
from ssmport.quant.recipes import BLOCK_SIZE, RECIPES, Recipe
from ssmport.state import zero_states

FORMS = ("float16", "int8", "uint4", "int4")  # most bytes first
# uint4 (int4 with a per-block zero point) is measured and shown, not chosen: on a device a
# nonzero int4 shift fell off the fused fast path (3 vs 16 tok/s, issue 34), for errors 6-14%
# smaller on rwkv7-pydoc (docs/quantization.md). Set True to let the measurement choose it.
CHOOSE_ZERO_POINTS = False
EXPERT_FORMS = ("float16", "int8", "int4")  # expert stacks are symmetric (ops.matmul.Int4Experts)
TABLE_FORMS = EXPERT_FORMS  # so are lookup tables, read by row (ops.matmul.QuantizedTable)
# A tied table's form where it is read from the int8 LM head's levels and scales (quant.tied):
# no bytes of its own, its rows the values an int8 table of its own holds. Not at 4 bits: a
# gather cannot read the converter's packed int4 constant.
SHARED = "shared"
CALIBRATION_STREAMS = 1
CALIBRATION_STEPS = 16
MAX_TENSOR_GROUPS = 96
# Graph, container and metadata beside the plan's weights: measured 60 KB (decode-only
# rwkv7-pydoc) to 182 KB (lfm2-moe-tiny with prefill), 0.3 MB at rwkv7-1.5b.
DEFAULT_RESERVE = 512 << 10

def form_bytes(form: str, shape: tuple[int, ...]) -> int:
    """What the plan records for a matmul weight [in, out] (or an expert stack [E, in, out]) stored
    as `form`: data (4-bit two to a byte), one fp16 scale per block, and uint4 zero points."""
    n = math.prod(shape)
    blocks = n // BLOCK_SIZE
    return {"float16": 2 * n, "int8": n + 2 * blocks, "int4": n // 2 + 2 * blocks,
            "uint4": n // 2 + 2 * blocks + blocks // 2}[form]  # fmt: skip


def lowered(weight: torch.Tensor, form: str) -> torch.Tensor:
    """The fp32 values a weight [in, out] (or a stack [E, in, out]) holds once stored as `form`."""
    if form == "float16":
        return weight.half().float()
    if weight.dim() == 3:
        return torch.stack([lowered(w, form) for w in weight])
    return dequantize_blockwise(quantize_blockwise(weight, 8 if form == "int8" else 4, form == "uint4"))


class _Probe(ExpertStack, nn.Module):
    """A matmul `x @ W` (or an expert stack read by index) with W fp32, that `lower` replaces by
    a stored form's values, its inputs then rounded to fp16 as the bundle's 16-bit matmuls take
    them; sums stay fp32 (the form's own error, not this runtime's fp16 sums)."""

    def __init__(self, weight: torch.Tensor, out_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.weight, self.out_dtype, self.low = weight.float().contiguous(), out_dtype, None

    dtype = torch.float32  # what an expert mixture casts its input to

    def lower(self, form: str | None) -> None:
        self.low = None if form is None else lowered(self.weight, form)

    def _w(self) -> torch.Tensor:
        return self.weight if self.low is None else self.low

    def _x(self, x: torch.Tensor) -> torch.Tensor:
        return x.float() if self.low is None else x.to(torch.float16).float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self._x(x) @ self._w()).to(self.out_dtype)

    def select(self, idx: torch.Tensor) -> torch.Tensor:  # expert stacks: the input is rounded by the caller
        return self._w()[idx]

    def whole(self) -> torch.Tensor:
        return self._w()


class _TableProbe(_Probe):
    """A lookup table [rows, width] read by row, lowered in blocks along its width (as
    `WeightBuilder.table` stores it); its rows are not rounded further (the graph reads fp32 rows)."""

    def lower(self, form: str | None) -> None:
        self.low = None if form is None else lowered(self.weight.t(), form).t()

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self._w()[ids]


@dataclass
class _Candidate:
    name: str
    role: str
    shape: tuple[int, ...]
    probe: _Probe
    forms: tuple[str, ...]


class _ProbeBuilder(WeightBuilder):
    """Builds the fp32 module with probes for every matmul the plan could store as integers, and
    counts the bytes of everything else as `auto` stores it (fp16 tables and odd-sized matmuls,
    fp32 vectors)."""

    def __init__(self, arch):
        super().__init__(RECIPES["fp32"], arch.keeps_float)
        self.candidates: list[_Candidate] = []
        self.fixed_bytes = 0

    def matmul(self, name, weight_in_out, role, out_dtype=torch.float32):
        probe = _Probe(weight_in_out, out_dtype)
        if weight_in_out.shape[0] % BLOCK_SIZE:
            self.fixed_bytes += form_bytes("float16", tuple(weight_in_out.shape))
        else:
            self.candidates.append(_Candidate(name, role, tuple(weight_in_out.shape), probe, FORMS))
        return probe

    def experts(self, name, stack_in_out, role, rows_read):
        probe = _Probe(stack_in_out.stacked())
        E, n_in, n_out = stack_in_out.shape
        if n_in % BLOCK_SIZE:
            self.fixed_bytes += form_bytes("float16", tuple(stack_in_out.shape))
        else:
            forms = EXPERT_FORMS if n_out % 2 == 0 else EXPERT_FORMS[:2]
            self.candidates.append(_Candidate(name, role, tuple(stack_in_out.shape), probe, forms))
        return probe

    def table(self, name, value, role):
        if value.shape[1] % BLOCK_SIZE:
            self.fixed_bytes += form_bytes("float16", tuple(value.shape))
            return nn.Parameter(value.float().contiguous(), requires_grad=False)
        probe = _TableProbe(value)
        self.candidates.append(_Candidate(name, role, tuple(value.shape), probe, TABLE_FORMS))
        return probe

    def keep_tables_if_room(self, room: int) -> None:
        """Tables stay 16-bit (no longer candidates) when every matmul at int4 leaves `room` for
        them: on rwkv7-pydoc at 3.5 MB, a plan that lowered the embedding to int8 had the smaller
        held-out error in torch (mse 7.0e-3 vs 8.1e-3 over 241 tokens, 6 flips each, none at a
        margin > 0.5) but flipped a gate step at a 0.46 margin; a table is lowered only to fit."""
        tables = [c for c in self.candidates if isinstance(c.probe, _TableProbe)]
        saved = sum(form_bytes("float16", c.shape) - form_bytes(c.forms[-1], c.shape) for c in tables)
        if room >= saved:
            self.candidates = [c for c in self.candidates if c not in tables]
            self.fixed_bytes += sum(form_bytes("float16", c.shape) for c in tables)

    def vector(self, name, value, role):
        self.fixed_bytes += 4 * value.numel()
        return nn.Parameter(value.float().contiguous(), requires_grad=False)


def _tied_candidates(module: nn.Module, candidates: list[_Candidate]) -> tuple[_Candidate, _Candidate] | None:
    """The LM head and embedding candidates of a tied model, else None: where the build looks
    (quant.tied.store_tied_table_once: `embed`, `head.proj`), the head's weight exactly the
    table transposed, so the int8 head's levels are the table's quantized (compared once here,
    before any measuring; the build checks them bit for bit again)."""
    embed, proj = getattr(module, "embed", None), getattr(getattr(module, "head", None), "proj", None)
    if not isinstance(embed, Embedding) or not isinstance(embed.weight, _TableProbe):
        return None
    by_probe = {id(c.probe): c for c in candidates}
    head, table = by_probe.get(id(proj)), by_probe.get(id(embed.weight))
    if head is None or table is None or "int8" not in head.forms or head.shape != table.shape[::-1]:
        return None
    return (head, table) if torch.equal(head.probe.weight.t(), table.probe.weight) else None


@dataclass
class _Group:
    """Tensors that get one stored form together (one tensor, or one role)."""

    name: str
    role: str
    members: list[_Candidate]
    forms: tuple[str, ...]
    bytes: dict[str, int] = field(default_factory=dict)
    mse: dict[str, float] = field(default_factory=dict)
    max_rel: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class AutoPlan:
    recipe: Recipe  # `auto` with each candidate's stored form (Recipe.per_tensor)
    budget: int
    reserve: int
    plan_bytes: int  # the weights as the plan will record them
    record: dict  # what the manifest's plan["auto"] holds


def plan_auto(model, budget: int, reserve: int = DEFAULT_RESERVE, on_pass=None, threads: int = 1,
              share_tied_table: bool = True) -> AutoPlan:
    """Measure every candidate's sensitivity on `model` and choose the stored forms that fit
    `budget` bytes (of which `reserve` is the asset's graph and container) with the least
    estimated error. A budget below the smallest possible bundle is refused in one line.
    `threads`: torch threads for the calibration steps (one suits small models on a busy machine).
    `share_tied_table`: whether a tied table may be read from an int8 head (--no-int8-tied-table: not)."""
    arch = model.architecture
    builder = _ProbeBuilder(arch)
    with torch.no_grad():
        module = arch.build_decode(model.config, model.weights, builder, torch.float32).eval()
    specs = arch.state_specs(model.config, torch.float32)
    tied = _tied_candidates(module, builder.candidates) if share_tied_table else None
    smallest = builder.fixed_bytes + sum(form_bytes(c.forms[-1], c.shape) for c in builder.candidates) + reserve
    builder.keep_tables_if_room(budget - smallest)  # room for 16-bit tables beside every matmul at int4
    groups = _groups(builder.candidates)
    pair, how = _tied_groups(groups, tied), "every matmul and table int4"
    if pair is not None:  # the table read from the int8 head: fewer bytes than both at int4 (n + n/16 vs n + n/8)
        head, table = pair
        smallest += head.bytes["int8"] - head.bytes[head.forms[-1]] - table.bytes[table.forms[-1]]
        how = "every matmul int4 but the tied LM head int8, the table read from it"
    if budget < smallest:
        raise SsmportError(f"--size-budget {budget:,} bytes is below the smallest {model.name} bundle auto can make: "
                           f"{smallest:,} bytes ({smallest / (1 << 20):.2f} MB: {how}, the rest 16-bit)")  # fmt: skip
    streams = calibration_streams(model)
    run = _Runner(module, specs, streams)
    caller_threads = torch.get_num_threads()
    torch.set_num_threads(threads)  # one-token steps at 0.1B: 8 ms on one thread, 30x that on two busy cores
    try:
        reference = run()
        scale = max(1.0, float(np.abs(reference).max()))
        for g in groups:
            for form in g.forms:
                for c in g.members:
                    c.probe.lower(form)
                delta = run() - reference
                g.mse[form] = float(np.mean(delta**2))
                g.max_rel[form] = float(np.abs(delta).max() / scale)
                if on_pass:
                    on_pass()
            for c in g.members:
                c.probe.lower(None)
    finally:
        torch.set_num_threads(caller_threads)
    choice = _choose_with_tied(groups, budget - reserve - builder.fixed_bytes, pair)
    shared = pair is not None and choice[pair[1].name] == SHARED
    # a shared table is built float and then read from the head (quant.tied), so it has no form here
    per_tensor = tuple(sorted((c.name, choice[g.name]) for g in groups for c in g.members if choice[g.name] != SHARED))
    plan_bytes = builder.fixed_bytes + sum(g.bytes[choice[g.name]] for g in groups)
    record = {
        "budget_bytes": budget,
        "reserved_for_graph_bytes": reserve,
        "plan_bytes": plan_bytes,
        "estimated_mse": sum(g.mse[choice[g.name]] for g in groups),
        "calibration": {"streams": len(streams), "steps": sum(map(len, streams)), "logit_scale": scale,
                        "measure": "mean squared Δlogits vs fp32, that group alone lowered (torch, fp32 sums)"},
        "granularity": "tensor" if len(groups) == len(builder.candidates) else "role",
        **({"tied": {"head": pair[0].name, "table": pair[1].name}} if pair else {}),
        "sensitivity": [{"group": g.name, "role": g.role, "tensors": len(g.members), "chosen": choice[g.name],
                         "bytes": g.bytes, "mse": g.mse, "max_rel_delta": g.max_rel} for g in groups],
    }  # fmt: skip
    del module, run
    recipe = replace(RECIPES["auto"], per_tensor=per_tensor, int8_tied_table=shared)
    return AutoPlan(recipe, budget, reserve, plan_bytes, record)


def calibration_streams(model) -> list[list[int]]:
    """The gate's streams (its texts through the model's tokenizer, else seeded ids), shorter."""
    from ssmport.gate.report import default_prompts

    tokenizer = None
    if model.vocab_path is not None:
        from ssmport.tokenizers import load_tokenizer

        tokenizer = load_tokenizer(model.vocab_path)
    return default_prompts(model.config.vocab_size, CALIBRATION_STREAMS, CALIBRATION_STEPS, tokenizer=tokenizer)


class _Runner:
    """The logits of every calibration step, [steps, V] fp64, from fresh states per stream."""

    def __init__(self, module, specs, streams):
        self.module, self.specs, self.streams = module, specs, streams

    def __call__(self) -> np.ndarray:
        rows = []
        with torch.no_grad():
            for s in self.streams:
                zero_states(self.module, self.specs)
                for pos, token in enumerate(s):
                    ids = torch.tensor([[token]], dtype=torch.int32)
                    rows.append(self.module(ids, torch.tensor([[pos]], dtype=torch.int32)).double().reshape(-1))
        return torch.stack(rows).numpy()


def _is_expert_stack(c: _Candidate) -> bool:
    return len(c.shape) == 3


def _groups(candidates: list[_Candidate]) -> list[_Group]:
    if len(candidates) <= MAX_TENSOR_GROUPS:
        parts = [(c.name, c.role, [c]) for c in candidates]
    else:
        by: dict[tuple[str, tuple[str, ...]], list[_Candidate]] = defaultdict(list)
        for c in candidates:
            by[(c.role, c.forms)].append(c)
        parts = [(f"{role} ({len(cs)} tensors{', experts' if _is_expert_stack(cs[0]) else ''})", role, cs)
                 for (role, forms), cs in by.items()]  # fmt: skip
    groups = []
    for name, role, members in parts:
        forms = members[0].forms
        g = _Group(name, role, members, forms)
        g.bytes = {f: sum(form_bytes(f, c.shape) for c in members) for f in forms}
        groups.append(g)
    return sorted(groups, key=lambda g: g.name)


def _choose(groups: list[_Group], room: int) -> dict[str, str]:
    """Greedy by error per byte: lower until the groups fit `room`, then raise while they still fit."""
    choice = {g.name: g.forms[0] for g in groups}
    used = sum(g.bytes[g.forms[0]] for g in groups)
    forms = {g.name: [f for f in g.forms if CHOOSE_ZERO_POINTS or "uint4" not in f.split("+")] for g in groups}

    def best(moves):
        return min(moves, default=None, key=lambda m: (m[0], m[1].name, m[2]))

    while used > room:
        moves = [((g.mse[f] - g.mse[choice[g.name]]) / (g.bytes[choice[g.name]] - g.bytes[f]), g, f)
                 for g in groups for f in forms[g.name] if g.bytes[f] < g.bytes[choice[g.name]]]  # fmt: skip
        _, g, f = best(moves)
        used += g.bytes[f] - g.bytes[choice[g.name]]
        choice[g.name] = f
    while True:
        moves = [(-(g.mse[choice[g.name]] - g.mse[f]) / (g.bytes[f] - g.bytes[choice[g.name]]), g, f)
                 for g in groups for f in forms[g.name]
                 if g.bytes[f] > g.bytes[choice[g.name]] and g.mse[f] < g.mse[choice[g.name]]
                 and used + g.bytes[f] - g.bytes[choice[g.name]] <= room]  # fmt: skip
        move = best(moves)
        if move is None:
            return choice
        _, g, f = move
        used += g.bytes[f] - g.bytes[choice[g.name]]
        choice[g.name] = f


def _tied_groups(groups: list[_Group], tied: tuple[_Candidate, _Candidate] | None) -> tuple[_Group, _Group] | None:
    """The groups of a tied head and table, where each is a group of its own (a role group of
    one tensor at role granularity) and the table is still a candidate (not kept 16-bit)."""
    if tied is None:
        return None
    head, table = (next((g for g in groups if len(g.members) == 1 and g.members[0] is c), None) for c in tied)
    return None if head is None or table is None else (head, table)


def _joint(head: _Group, table: _Group) -> _Group:
    """The tied head and table as one choice: every pair of their own forms ("h+t"), and the
    table read from the int8 head ("int8+shared"): the int8 head's bytes, the error of both at
    int8 (the same levels and scales as an int8 table of its own). The table's row records
    `SHARED` with no bytes and its int8 measurement."""
    table.bytes[SHARED], table.mse[SHARED], table.max_rel[SHARED] = 0, table.mse["int8"], table.max_rel["int8"]
    pairs = [(h, t) for h in head.forms for t in table.forms] + [("int8", SHARED)]
    g = _Group(f"{head.name} + {table.name}", head.role, head.members + table.members,
               tuple(f"{h}+{t}" for h, t in pairs))  # fmt: skip
    for (h, t), form in zip(pairs, g.forms):
        g.bytes[form], g.mse[form] = head.bytes[h] + table.bytes[t], head.mse[h] + table.mse[t]
    return g


def _choose_with_tied(groups: list[_Group], room: int, pair: tuple[_Group, _Group] | None) -> dict[str, str]:
    """`_choose`, the tied head and table (if any) chosen together as `_joint`, then split back."""
    if pair is None:
        return _choose(groups, room)
    joint = _joint(*pair)
    choice = _choose([g for g in groups if all(g is not p for p in pair)] + [joint], room)
    choice[pair[0].name], choice[pair[1].name] = choice.pop(joint.name).split("+")
    return choice
