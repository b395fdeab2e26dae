"""Build an architecture's weights under a recipe, recording the per-tensor plan.

Architecture files ask the builder for each weight (`matmul`, `table`, `vector`); it decides
the storage (fp32 / fp16 / int8 + scales) from the recipe and the architecture's own
`keeps_float` predicate, and records one plan entry per stored tensor. The plan goes into
the manifest; its byte total is the asset's analytic size.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import nn

from ssmport.loader.checkpoint import storage_key
from ssmport.ops.matmul import (BlockwiseMatmul, FloatExperts, FloatMatmul, Int4Experts, Int8Experts, QuantizedTable,
                                pack_nibbles)
from ssmport.quant.blockwise import Blockwise, quantize_blockwise
from ssmport.quant.recipes import BLOCK_SIZE, FLOAT, Recipe
from ssmport.state import dtype_name


@dataclass(frozen=True)
class PlanEntry:
    name: str  # canonical checkpoint name the tensor came from
    role: str  # architecture-defined category ("ffn", "head", "state_proj", "lora", ...)
    shape: tuple[int, ...]  # stored shape ([in, out] for matmuls)
    dtype: str  # "float32" | "float16" | "int8" | "int4" | "uint4" (affine: with zero points)
    block: int | None  # integer block length along `in`, else None
    bytes: int  # data bytes (4-bit: two to a byte), plus scale and zero-point bytes
    rows_read: int | None = None  # a stack read by index (experts): leading rows one token reads
    shares: str | None = None  # a table read from this tensor's storage (a tied head): its bytes are there

    def to_json(self) -> dict:
        d = asdict(self)
        d["shape"] = list(self.shape)
        for optional in ("rows_read", "shares"):  # only expert stacks and shared tables say them
            if d[optional] is None:
                del d[optional]
        return d


class ExpertSlices:
    """A stack [E, in, out] of per-expert weights that a builder reads one expert at a time
    (`read(e)` -> [in, out]): a quantizing builder stores each expert as it reads it and never
    holds the float stack, which at released widths is GBs a layer (Qwen3.5-35B-A3B's gate|up,
    256 x 2,048 x 1,024 fp32: 2.1 GB, beside its 0.27 GB of int4)."""

    def __init__(self, count: int, read: Callable[[int], torch.Tensor]):
        self.count, self.read = count, read
        self._first = read(0)  # shape, dtype and device (meta, for a shape-only build)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.count, *self._first.shape)

    @property
    def is_meta(self) -> bool:
        return self._first.is_meta

    @property
    def device(self) -> torch.device:
        return self._first.device

    def __iter__(self):
        yield self._first
        for e in range(1, self.count):
            yield self.read(e)

    def stacked(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The whole stack [E, in, out] in `dtype` (default: as read), filled an expert at a time."""
        first = self._first
        stack = torch.empty(self.shape, dtype=dtype or first.dtype, device=first.device)
        for e, w in enumerate(self):
            stack[e] = w
        return stack


class WeightBuilder:
    """Hands an architecture's `build_decode` its weights, stored as the recipe says.

    Architectures receive one (they never construct it) and ask it for every weight:
    `matmul` (a module computing `x @ W`), `table` (an embedding), `vector` (a per-channel
    fp32 operand). `recipe.logits_dtype` is the dtype the logits must leave the graph in.
    Each stored tensor becomes one entry of the manifest's per-tensor plan.
    """

    def __init__(
        self,
        recipe: Recipe,
        keeps_float: Callable[[str], bool],
        on_store: Callable[[int], None] | None = None,  # called with each tensor's element count
        int8_safe: Callable[[str], bool] | None = None,  # the architecture's `int8_safe` (default: none)
        int4_safe_experts: bool = False,  # the architecture's `int4_safe_experts`
    ):
        self.recipe = recipe
        self.keeps_float = keeps_float
        self.int8_safe = int8_safe or (lambda name: False)
        self.int4_safe_experts = int4_safe_experts
        self.on_store = on_store
        self.entries: list[PlanEntry] = []
        self._entry_of: dict[int, int] = {}  # id of a stored module or Parameter -> its entry's index
        # storage_key -> the one view of it stored (offset, shape, stride, dtype)
        self._stored: dict[int, tuple] = {}
        # id of a float table -> the tensor it was built from, where the recipe may read a tied
        # table from an int8 LM head: what that head must have been quantized from (ssmport.quant.tied)
        self._table_sources: dict[int, torch.Tensor] = {}

    @classmethod
    def for_architecture(cls, recipe: Recipe, arch, on_store: Callable[[int], None] | None = None) -> WeightBuilder:
        """A builder that applies `arch`'s quantization predicates."""
        return cls(recipe, arch.keeps_float, on_store, getattr(arch, "int8_safe", None),
                   getattr(arch, "int4_safe_experts", False))  # fmt: skip

    def matmul(
        self,
        name: str,
        weight_in_out: torch.Tensor,
        role: str,
        out_dtype: torch.dtype = torch.float32,
    ) -> nn.Module:
        """A module computing `x @ W` for W [in, out], stored as the recipe says."""
        n_in, n_out = weight_in_out.shape
        bits, affine = self._storage(name, role)
        if bits is not FLOAT and n_in % BLOCK_SIZE == 0:
            b = _quantize_in_column_chunks(weight_in_out, bits, affine)
            self._record(name, role, b.q.shape, b.storage_dtype, BLOCK_SIZE, b.nbytes)
            return self._keep(BlockwiseMatmul(b.q, b.scale, b.zero_point, b.bits, out_dtype, self.recipe.compute_dtype))
        # Matmuls whose input dim is not a multiple of the block stay in float.
        w = weight_in_out.to(self.recipe.float_dtype)
        self._record(name, role, w.shape, w.dtype, None, w.numel() * w.element_size())
        return self._keep(FloatMatmul(w, out_dtype))

    def experts(self, name: str, stack_in_out: ExpertSlices, role: str, rows_read: int) -> nn.Module:
        """A stack of per-expert matmul weights [E, in, out] read by expert index (FloatExperts /
        Int8Experts / Int4Experts), stored as `matmul` would store each expert (symmetric blocks); `rows_read`: the experts one
        token reads (top-k), what the roofline counts."""
        E, n_in, n_out = stack_in_out.shape
        bits, _ = self._storage(name, role, expert_stack=True)
        if bits is not FLOAT and n_in % BLOCK_SIZE == 0:
            # symmetric whatever the recipe's zero point: the gathered form dequantizes in plain ops
            bits = 8 if bits == 4 and n_out % 2 else bits  # 4-bit packs column pairs
            # each expert quantized (and packed) into the stored stacks as it is read
            q = torch.empty(E, n_in, n_out // 2 if bits == 4 else n_out, dtype=torch.uint8 if bits == 4 else torch.int8,
                            device=stack_in_out.device)  # fmt: skip
            scale = torch.empty(E, n_in // BLOCK_SIZE, n_out, dtype=torch.float16, device=stack_in_out.device)
            for e, w in enumerate(stack_in_out):
                b = _quantize_in_column_chunks(w, bits, False)
                q[e], scale[e] = pack_nibbles(b.q) if bits == 4 else b.q, b.scale
            # every expert's block the same shape, so the same bytes
            self._record(name, role, (E, n_in, n_out), b.storage_dtype, BLOCK_SIZE, E * b.nbytes, rows_read)
            return self._keep(Int4Experts(q, scale) if bits == 4 else Int8Experts(q, scale))
        w = stack_in_out.stacked(self.recipe.float_dtype)
        self._record(name, role, w.shape, w.dtype, None, w.numel() * w.element_size(), rows_read)
        return self._keep(FloatExperts(w))

    def _storage(self, name: str, role: str, expert_stack: bool = False) -> tuple[int | None, bool]:
        return self.recipe.storage(name, role, self.keeps_float(name), self.int8_safe(name), expert_stack,
                                   self.int4_safe_experts)  # fmt: skip

    def table(self, name: str, value: torch.Tensor, role: str) -> nn.Parameter | QuantizedTable:
        """A lookup table (embedding) [rows, width], stored in the recipe's float dtype, or where
        an `auto` plan chose integers, as symmetric blocks of 32 along the width read by row."""
        bits = self.recipe.table_bits(name)
        if bits is FLOAT or value.shape[1] % BLOCK_SIZE:
            table = self._param(name, value.to(self.recipe.float_dtype), role)
            if self.recipe.int8_tied_table:
                self._table_sources[id(table)] = value
            return table
        b = _quantize_in_column_chunks(value.t(), bits, False)  # blocks along the width
        q, scale = b.q.t(), b.scale.t()
        self._record(name, role, tuple(q.shape), b.storage_dtype, BLOCK_SIZE, b.nbytes)
        return self._keep(QuantizedTable(pack_nibbles(q) if bits == 4 else q, scale, bits))

    def vector(self, name: str, value: torch.Tensor, role: str) -> nn.Parameter:
        """A per-channel operand of fp32 elementwise math (norm gains, mixes, biases).

        Always fp32: the converter folds a cast of an fp16 constant into an fp32 constant,
        so fp16 storage would not survive into the asset anyway (measured), and these
        tensors are a fraction of a percent of the weights.
        """
        return self._param(name, value.to(torch.float32), role)

    def _param(self, name: str, value: torch.Tensor, role: str) -> nn.Parameter:
        v = value.contiguous()
        self._record(name, role, v.shape, v.dtype, None, v.numel() * v.element_size())
        return self._keep(nn.Parameter(v, requires_grad=False))

    def share(self, table, storage) -> None:
        """Record that `table` (a stored table) is read from `storage`'s stored tensor: its
        entry keeps its name and shape, takes the storage's dtype and block (what its rows are
        now read as), with no bytes of its own."""
        entry = self.entries[self._entry_of[id(table)]]
        owner = self.entries[self._entry_of[id(storage)]]
        self.entries[self._entry_of[id(table)]] = dataclasses.replace(entry, dtype=owner.dtype, block=owner.block,
                                                                      bytes=0, shares=owner.name)  # fmt: skip

    def take_table_sources(self) -> dict[int, torch.Tensor]:
        """The float tables' source tensors (by id of the stored table), held since `table` and
        let go now: a source may be a computed temporary the size of the table."""
        sources, self._table_sources = self._table_sources, {}
        return sources

    def _keep(self, stored):
        if isinstance(stored, nn.Module):
            for module in stored.modules():
                for table in (module._parameters, module._buffers):
                    for name, t in table.items():
                        if t is not None:
                            table[name] = self._owning(t)
        else:
            stored = self._owning(stored)
        self._entry_of[id(stored)] = len(self.entries) - 1  # every store records its entry first
        return stored

    def _owning(self, t: torch.Tensor) -> torch.Tensor:
        """`t`, or a copy of it when it is a view of a storage it does not own alone.

        The converter frees a stored weight's storage once it has copied the weight into the
        program (exporter's releasing converter); a second view of that storage would then
        read freed memory. A plugin slicing its layers' weights out of one fused tensor hands
        over such views. Memory-mapped storages are never freed, so they are not copied; a
        weight that owns its whole storage (the usual case) is not copied either."""
        storage = t.untyped_storage()
        view = (t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        whole = t.is_contiguous() and t.storage_offset() == 0 and storage.nbytes() == t.numel() * t.element_size()
        if storage.resizable() and not (whole and self._stored.get(storage_key(t), view) == view):
            copy = t.detach().clone(memory_format=torch.contiguous_format)
            t = nn.Parameter(copy, requires_grad=False) if isinstance(t, nn.Parameter) else copy
            view = (t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        self._stored[storage_key(t)] = view
        return t

    def stored(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` is (a view of) a weight this builder stored. Such a tensor may
        still be the source's own (an fp32 checkpoint tensor is stored as it is)."""
        return storage_key(tensor) in self._stored

    def _record(self, name, role, shape, dtype, block, nbytes, rows_read=None) -> None:
        dtype = dtype if isinstance(dtype, str) else dtype_name(dtype)
        self.entries.append(PlanEntry(name, role, tuple(shape), dtype, block, int(nbytes), rows_read))
        if self.on_store:
            self.on_store(math.prod(shape))

    def plan_json(self) -> list[dict]:
        return [e.to_json() for e in self.entries]


# Quantizing a weight makes a few fp32 temporaries of its size; in chunks of this many
# output columns they stay small (a 4096 x 65536 LM head: 4 x 1 GB otherwise). Scales are
# per (block, column), so the chunks are independent and the result is the same.
QUANT_CHUNK_COLUMNS = 4096


def _quantize_in_column_chunks(weight_in_out: torch.Tensor, bits: int, affine: bool) -> Blockwise:
    n_in, n_out = weight_in_out.shape
    if n_out <= QUANT_CHUNK_COLUMNS:
        return quantize_blockwise(weight_in_out, bits, affine)
    device = weight_in_out.device  # meta in a shape-only build (benchmarks/plan_sizes.py)
    q = torch.empty(n_in, n_out, dtype=torch.uint8 if affine else torch.int8, device=device)
    scale = torch.empty(n_in // BLOCK_SIZE, n_out, dtype=torch.float16, device=device)
    zero = torch.empty(n_in // BLOCK_SIZE, n_out, dtype=torch.uint8, device=device) if affine else None
    for start in range(0, n_out, QUANT_CHUNK_COLUMNS):
        cols = slice(start, start + QUANT_CHUNK_COLUMNS)
        chunk = quantize_blockwise(weight_in_out[:, cols], bits, affine)
        q[:, cols], scale[:, cols] = chunk.q, chunk.scale
        if affine:
            zero[:, cols] = chunk.zero_point
    return Blockwise(q, scale, zero, bits)


def plan_notes(recipe, summary: dict) -> list[str]:
    """The manifest's notes on a plan (its `summarize_plan` summary): one when a fixed 4-bit
    recipe stores no 4-bit weight. On Mamba-1 and Mamba-2 int4keepproj keeps what int8keepproj
    keeps (their projections feed the recurrence, the head is int8; docs/quantization.md), so a
    user who chose it for its size is told, with the recipe that does put every matmul at 4 bits."""
    if recipe.bits != 4 or recipe.per_tensor or {"int4", "uint4"} & set(summary["by_dtype"]):
        return []
    return [f"{recipe.name} stores no 4-bit weight for this architecture: each matmul it would put at 4 bits "
            "is one the architecture keeps 16-bit or int8 (what feeds its recurrence, and the head); "
            "--quant int4 puts every matmul at 4 bits"]


def summarize_plan(entries: list[dict]) -> dict[str, dict[str, int]]:
    """Totals by role and by dtype: {"by_role": {role: bytes}, "by_dtype": {dtype: bytes}}."""
    by_role: dict[str, int] = defaultdict(int)
    by_dtype: dict[str, int] = defaultdict(int)
    for e in entries:
        by_role[e["role"]] += e["bytes"]
        by_dtype[e["dtype"]] += e["bytes"]
    return {"by_role": dict(by_role), "by_dtype": dict(by_dtype), "total": sum(by_role.values())}
