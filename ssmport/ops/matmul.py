"""Matmuls as the Core AI runtime wants them: the only module that touches coreai-torch's
compression internals.

Weights are stored `[in, out]` and applied as `x @ W`: `nn.Linear` lowers to a transpose +
batch_matmul that re-transposes the weight on every call (20x slower decode here).

Activations between matmuls are fp32; a matmul casts its input to the weight's dtype and
its output back, so fp16/int8 recipes do their matmuls in fp16 and everything elementwise
(norms, gates, the recurrence) in fp32.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from coreai_torch._compression.custom_layers import WeightDequantizeModule
from torch import nn


# Above this many output columns a many-row product runs as (W^T x^T)^T: this runtime's
# [T, in] @ [in, out] kernel slows down on wide outputs (T=64 rows, measured in one process:
# 2048x8192 850 ms as x @ W vs 408 ms transposed; 768x65536 2840 vs 1484 ms; at 4096
# columns and below x @ W is faster: 1024x4096 76 vs 108 ms, 768x3072 40 vs 56 ms).
# One-row products (decode) always use x @ W.
WIDE_OUTPUT = 4096


def rows_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [R, in] @ w [in, out], in the faster form for this runtime."""
    if x.dim() == 2 and x.shape[0] > 1 and w.shape[1] > WIDE_OUTPUT:
        return (w.t() @ x.t()).t()
    return x @ w


# Summing as the reference loops do. The one-row x @ W with W [in, out] (this export form's
# layout) adds the `in` products of each output one after another on torch's CPU kernel (MKL
# gemv); the Core AI runtime's error is the same size (measured, not inspected): 4x the loops'
# W @ x at in = 2048 (9.3e-7 vs 2.3e-7 of the output scale), amplified by depth (docs/quantization.md,
# "Where the fp32 export form loses precision"). Inside `reference_sums()` an fp32 matmul adds
# its products in runs of REFERENCE_RUN, then the runs: the same products, summed as accurately
# as W @ x. Opt-in for eager measurements (benchmarks/fp32_reference_sums.py): no gate or
# runner enters it, and an export never does, so every graph is unchanged.
REFERENCE_RUN = 256
_reference_sums = False


@contextmanager
def reference_sums() -> Iterator[None]:
    """fp32 matmuls in this block sum in runs of REFERENCE_RUN (eager measurements only)."""
    global _reference_sums
    before, _reference_sums = _reference_sums, True
    try:
        yield
    finally:
        _reference_sums = before


def _in_runs(w: torch.Tensor) -> bool:
    n_in = w.shape[-2]
    return _reference_sums and w.dtype == torch.float32 and n_in > REFERENCE_RUN and n_in % REFERENCE_RUN == 0


def _run_sums(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [R, in] @ w [..., in, out] -> [..., R, out], the products added in runs, then the runs."""
    runs = w.shape[-2] // REFERENCE_RUN
    parts = x.reshape(-1, runs, REFERENCE_RUN).transpose(0, 1) @ w.reshape(*w.shape[:-2], runs, REFERENCE_RUN, -1)
    return parts.sum(dim=-3)  # [..., runs, R, out] -> [..., R, out]


# A matmul whose output is wider than this runs as a batch of column blocks of this width:
# on the Linux Core AI runtime `x @ W` streams a [2048, 8192] fp32 weight at ~13 GB/s but
# 4-8 column blocks of it at ~26 GB/s (the machine's single-thread read bandwidth); the LM
# head [C, 65536] likewise (benchmarks/matmul_shapes.py). Same dot products, same sums.
# Widths that 1024 does not divide (a padded vocab of 50288, Mamba-2's in_proj of 3352) use
# the widest divisor down to MIN_OUT_BLOCK: 768x50288 streamed at 12.3 GB/s plain and 24.9 in
# 56 blocks of 898, 1024x4352 at 14.4 and 28.3 (benchmarks/matmul_shapes.py).
# A narrow odd width gives way to an even one up to MAX_OUT_BLOCK: odd widths below 3/4 of
# OUT_BLOCK streamed slower (benchmarks/matmul_shapes.py --blockings, best of 30 calls, two
# passes): Nemotron-H-4B's in_proj 3136x17504 as 32 blocks of 547 at 26.1-28.2 GB/s, as 16 of
# 1094 at 30.3-31.1; Mamba-2-2.7B's 2560x10576 as 16 of 661 at 28.6-28.9, 8 of 1322 at
# 30.9-31.1; 1024x32784 as 48 of 683 at 27.9-30.1, 24 of 1366 at 29.3-30.3. Wider odd widths
# did not: 2048x9228 as 12 of 769 at 31.8-32.0 against 30.8-31.2 as 6 of 1538; 3072x6680 as
# 8 of 835 at 29.4-29.7 against 28.1-29.1 as 10 of 668.
OUT_BLOCK = 1024
MIN_OUT_BLOCK = 256
MAX_OUT_BLOCK = 2 * OUT_BLOCK
NARROW_ODD_BLOCK = 3 * OUT_BLOCK // 4
MAX_UNBLOCKED_OUT = 2048


def out_blocks(n_out: int) -> int:
    """How many column blocks a weight with `n_out` outputs is stored as (1 = plain [in, out]):
    the widest divisor from MIN_OUT_BLOCK up to OUT_BLOCK, unless it is odd and narrower than
    NARROW_ODD_BLOCK and an even divisor up to MAX_OUT_BLOCK exists (the narrowest is taken)."""
    if n_out <= MAX_UNBLOCKED_OUT:
        return 1
    widths = [w for w in range(MIN_OUT_BLOCK, MAX_OUT_BLOCK + 1) if n_out % w == 0]
    width = max((w for w in widths if w <= OUT_BLOCK), default=None)
    if width is not None and width % 2 and width < NARROW_ODD_BLOCK:
        width = min((w for w in widths if w % 2 == 0), default=width)
    return n_out // width if width else 1


class FloatMatmul(nn.Module):
    """y = x @ W with W [in, out] stored in fp32 or fp16.

    A wide W is stored as `out_blocks` column blocks [blocks, in, out/blocks] and applied as
    one broadcast batch matmul; the result is laid back out as [..., out].
    """

    def __init__(self, weight_in_out: torch.Tensor, out_dtype: torch.dtype = torch.float32, blocks: int | None = None):
        super().__init__()
        n_in, n_out = weight_in_out.shape
        self.blocks = out_blocks(n_out) if blocks is None else blocks  # given: benchmarks/matmul_shapes.py
        w = weight_in_out
        if self.blocks > 1:
            w = w.reshape(n_in, self.blocks, n_out // self.blocks).permute(1, 0, 2)
        self.weight = nn.Parameter(w.contiguous(), requires_grad=False)
        self.n_out = n_out
        self.out_dtype = out_dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        x = x.to(w.dtype)
        if _in_runs(w):  # the eager reference only (see REFERENCE_RUN)
            y = _run_sums(x.reshape(-1, x.shape[-1]), w)
            y = y if self.blocks == 1 else y.permute(1, 0, 2)  # [blocks, rows, out/blocks] -> [rows, blocks, ...]
            y = y.reshape(*x.shape[:-1], self.n_out)
        elif self.blocks == 1:
            y = rows_matmul(x, w)
        else:
            lead = x.shape[:-1]
            rows = math.prod(lead)
            y = x.reshape(1, rows, x.shape[-1]) @ w  # [blocks, rows, out/blocks]
            if rows > 1:  # one row (decode) needs no transpose: the blocks are already in order
                y = y.permute(1, 0, 2)
            y = y.reshape(*lead, self.n_out)
        return y.to(self.out_dtype)

    def holds_transpose_of(self, table: torch.Tensor) -> bool:
        """Whether W is exactly `table` [out, in] transposed, dtype included (a tied LM head)."""
        n_in, width = self.weight.shape[-2], self.n_out // self.blocks
        if not isinstance(table, torch.Tensor) or table.dtype != self.weight.dtype or tuple(table.shape) != (self.n_out, n_in):
            return False
        w = self.weight.view(self.blocks, n_in, width)
        spans = ((b, c, min(c + TIE_CHECK_COLUMNS, width)) for b in range(self.blocks) for c in range(0, width, TIE_CHECK_COLUMNS))
        return all(torch.equal(w[b, :, c:e], table[b * width + c:b * width + e].t()) for b, c, e in spans)

    def columns(self, ids: torch.Tensor) -> torch.Tensor:
        """Columns `ids` [T] of W as rows [T, in] fp32, read from this storage: a table tied to
        this weight (`holds_transpose_of`) needs no copy of its own."""
        return gather_columns(self.weight, ids, self.n_out // self.blocks).float()


def gather_columns(w: torch.Tensor, ids: torch.Tensor, width: int, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Columns `ids` [T] of a weight [in, out] stored as it is or as column blocks [blocks, in,
    width], as rows [T, in] (or, plain [rows, out] only, the column's entries at `rows` [n]: [T, n]):
    one gather of `in` values per id from the flattened constant,
    whose reshape keeps the one constant (measured with coreai-torch 0.4.3, fp32 and int8: an
    indexing with a slice between the two index axes, `w[:, ids]`, made the converter store a
    second copy of a float weight; `w.t()[ids]` a second copy of an int8 one;
    benchmarks/tied_int8_forms.py)."""
    n_in = w.shape[-2]
    ids = ids.long().view(-1, 1)
    rows = torch.arange(n_in) if rows is None else rows
    # id = block * width + column sits at block * in * width + column + i * width
    flat = ids + rows.view(1, -1) * width
    if w.dim() == 3 and w.shape[0] > 1:
        flat = flat + torch.div(ids, width, rounding_mode="floor") * ((n_in - 1) * width)
    return w.reshape(-1)[flat]


# Columns compared at a time when checking a tie: no temporaries of a whole head.
TIE_CHECK_COLUMNS = 4096


class BlockwiseMatmul(nn.Module):
    """y = x @ dequant(Q, S[, Z]): 8- or 4-bit Q [in, out], fp16 scales S [in/32, out] and, when
    affine, zero points Z [in/32, out] in the asset.

    `coreai::constexpr_blockwise_shift_scale` keeps the data, scales and zero points as
    constants and dequantizes in-graph (on device the backend fuses it into the matmul). At 4
    bits `input_dtype` tells the converter to pack the int8/uint8 values two to a byte (`si4` /
    `ui4` in the program). The dequantized weight is fp16 (the scales' dtype); with an fp32
    `compute_dtype` it is cast up and the matmul runs in fp32 on fp32 activations.
    """

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None = None, bits: int = 8,
                 out_dtype: torch.dtype = torch.float32, compute_dtype: torch.dtype | None = None):  # fmt: skip
        super().__init__()
        sub_byte = {(4, torch.int8): torch.int4, (4, torch.uint8): torch.uint4}.get((bits, q.dtype))
        if bits != 8 and sub_byte is None:
            raise ValueError(f"{bits}-bit {q.dtype} weights are not supported")
        self.dequant = WeightDequantizeModule(q, scale, zero_point=zero_point, input_dtype=sub_byte)
        self.out_dtype = out_dtype
        self.compute_dtype = compute_dtype or scale.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.dequant().to(self.compute_dtype)
        return rows_matmul(x.to(w.dtype), w).to(self.out_dtype)

    @property
    def symmetric_int8(self) -> bool:
        """Whether Q holds one signed byte per weight and no zero points: what `columns` reads."""
        d = self.dequant
        return d.input_dtype is None and d.quantized_data.dtype == torch.int8 and d.zero_point is None

    def columns(self, ids: torch.Tensor) -> torch.Tensor:
        """Columns `ids` [T] of the dequantized weight as rows [T, in] fp32, read from this
        storage (symmetric int8 only): the chosen columns' levels and scales are gathered from
        the constants the dequantization reads, and only those are dequantized, so a table
        quantized as this weight needs no copy of its own. (A 4-bit Q cannot be gathered: the
        converter refuses an index into an si4 constant, coreai-torch 0.4.3.)"""
        if not self.symmetric_int8:
            raise ValueError("only a symmetric int8 weight's columns can be read")
        q, scale = self.dequant.quantized_data, self.dequant.scale
        n_in, width = q.shape
        # each level's own scale gathered beside it: no reshapes into blocks (3 kernels fewer a
        # call than gathering one scale a block, as many as a table of its own costs;
        # benchmarks/tied_int8_forms.py)
        block_of = torch.div(torch.arange(n_in), n_in // scale.shape[0], rounding_mode="floor")
        return gather_columns(q, ids, width).float() * gather_columns(scale, ids, width, block_of).float()


class Int8Matmul(BlockwiseMatmul):
    """y = x @ dequant(Q, S): int8 Q [in, out] and fp16 scales S [in/32, out] (fp16 compute)."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype = torch.float32):
        super().__init__(q, scale, out_dtype=out_dtype)


class ExpertStack:
    """What every stack of per-expert weights [E, in, out] read by expert index offers (the export
    forms below, the gate's and `auto`'s probes): `select(idx)` the chosen experts' weights
    [n, in, out], `whole()` the stack, and `times(x, idx)` a token's rows times its chosen experts'
    weights, the form `models.moe.ExpertMixture` applies them in. `float_stack`: whether `weight[e]`
    holds expert e's weights as they are (float), so one expert can be read in place by a static view."""

    float_stack = False

    def times(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """x [T, 1 or k, 1, in] @ the chosen experts' weights (idx [T*k]: token t's k experts at
        t*k..) -> [T, k, 1, out]."""
        w = self.select(idx)
        return x @ w.view(x.shape[0], -1, *w.shape[1:])


class FloatExperts(ExpertStack, nn.Module):
    """A stack of per-expert weights W[e] [in, out] (fp32 or fp16), read by expert index.

    `select(idx)` reads only the chosen experts' weights (a gather on the stack: what a
    decode step of a mixture-of-experts layer reads); `whole()` the stack, for the dense form
    that runs every expert (a prefill chunk whose tokens between them choose most experts)."""

    float_stack = True

    def __init__(self, stack: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(stack.contiguous(), requires_grad=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.weight.dtype

    def select(self, idx: torch.Tensor) -> torch.Tensor:
        # W[idx] (aten.index): 18.9 ms for 4 of 32 experts of 1024x1536 + 768x1024 fp32 on this
        # runtime, against 392 ms as index_select (GatherMM's decomposition: 534 ms) and 46.6 as
        # an embedding lookup on [E, in*out] (benchmarks/moe_gathers.py; docs/hybrids.md section 9)
        return self.weight[idx]

    def whole(self) -> torch.Tensor:
        return self.weight


# Integer experts are dequantized in fp32 elementwise ops and rounded to the scales' dtype once:
# the same fp16 weights as level x scale in fp16 (a level of at most 8 bits times an 11-bit fp16
# significand is exact in fp32, so one rounding either way), but this runtime emulates fp16
# elementwise ops: one MoE layer of LFM2-8B-A1B (4 of 32 experts, 2048 x 3584 + 1792 x 2048,
# int4) spent 1,023 ms of a 3,868 ms call in fp16 mul / sub / floor, and 106 ms in the fp32 ones
# of `Int4Experts` below (benchmarks/moe_int4_forms.py; benchmarks/README.md, LFM2-8B-A1B).
class Int8Experts(ExpertStack, nn.Module):
    """The int8 form of `FloatExperts`: Q [E, in, out] int8 and fp16 scales [E, in/32, out].

    The chosen experts' Q and scales are gathered first and dequantized after, in plain ops
    (the constexpr dequantization of `Int8Matmul` would expand the whole stack on every call)."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor):
        super().__init__()
        self.q = nn.Parameter(q.contiguous(), requires_grad=False)
        self.scale = nn.Parameter(scale.contiguous(), requires_grad=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.scale.dtype

    def _dequantize(self, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        w = q.float()
        n, n_in, n_out = w.shape
        blocks = scale.shape[1]
        w = w.view(n, blocks, n_in // blocks, n_out) * scale.float().view(n, blocks, 1, n_out)
        return w.view(n, n_in, n_out).to(self.dtype)

    def select(self, idx: torch.Tensor) -> torch.Tensor:
        return self._dequantize(self.q[idx], self.scale[idx])

    def whole(self) -> torch.Tensor:
        return self._dequantize(self.q, self.scale)


# Offset of a symmetric 4-bit level in its nibble: q in [-7, 7] is stored as q + 8 in [1, 15].
NIBBLE_OFFSET = 8


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """Symmetric 4-bit levels q [..., out] (int8 in [-7, 7]) two to a byte: uint8 [..., out/2]
    holding column j in the low nibble and column j + out/2 in the high one (halves, not
    neighbours, so each nibble's columns are one contiguous half of the output)."""
    half = q.shape[-1] // 2
    n = (q.to(torch.int16) + NIBBLE_OFFSET).to(torch.uint8)
    return n[..., :half] + 16 * n[..., half:]


class Int4Experts(Int8Experts):
    """The 4-bit form of `FloatExperts`: packed Q [E, in, out/2] uint8 (`pack_nibbles`: two
    symmetric 4-bit levels a byte, so the asset holds half a byte per weight) and fp16 scales,
    stored as [E, 2, in/32, out/2] (the low nibbles' output half, then the high nibbles').

    As `Int8Experts`, the chosen experts are gathered first and dequantized after in plain ops:
    the constexpr sub-byte dequantization of `BlockwiseMatmul` would expand the whole stack on
    every call. The nibbles are split in float arithmetic (exact: every byte value and every
    level is an integer), which needs no integer bit operations of the runtime, and into a
    [n, 2, in, out/2] weight by broadcasting, not concatenated into [n, in, out]: this runtime
    wrote the concatenated halves at ~66 MB/s (1,317 ms of a 3,868 ms LFM2-8B-A1B MoE layer,
    benchmarks/moe_int4_forms.py). `times` multiplies by both halves in one batched matmul, whose
    [.., 2, 1, out/2] result is already the row [.., 1, out]."""

    def __init__(self, packed: torch.Tensor, scale: torch.Tensor):
        E, blocks, n_out = scale.shape
        super().__init__(packed, scale.view(E, blocks, 2, n_out // 2).transpose(1, 2))
        # levels = p * KEEP + floor(p / 16) * SPLIT - 8: the low nibble (p - 16 high) in row 0, the high in row 1
        self.register_buffer("keep", torch.tensor([1.0, 0.0]).view(2, 1, 1), persistent=False)
        self.register_buffer("split", torch.tensor([-16.0, 1.0]).view(2, 1, 1), persistent=False)

    def _halves(self, packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """Gathered packed Q [n, in, out/2] and scales [n, 2, in/32, out/2] -> weights [n, 2, in, out/2]."""
        p = packed.float().unsqueeze(1)  # [n, 1, in, out/2]
        levels = p * self.keep + torch.floor(p * (1 / 16)) * self.split - NIBBLE_OFFSET  # [n, 2, in, out/2]
        n, _, n_in, half = levels.shape
        blocks = scale.shape[2]
        w = levels.view(n, 2, blocks, n_in // blocks, half) * scale.float().view(n, 2, blocks, 1, half)
        return w.view(n, 2, n_in, half).to(self.dtype)

    def _dequantize(self, packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        w = self._halves(packed, scale)  # [n, 2, in, out/2] -> [n, in, out]
        n, _, n_in, half = w.shape
        return w.transpose(1, 2).reshape(n, n_in, 2 * half)

    def times(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        w = self._halves(self.q[idx], self.scale[idx])
        n, _, n_in, half = w.shape
        y = x.unsqueeze(2) @ w.view(x.shape[0], -1, 2, n_in, half)  # [T, k, 2, 1, out/2]
        return y.view(*y.shape[:2], 1, 2 * half)


def unpack_nibbles(packed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`pack_nibbles`' levels back, as `dtype` [..., 2 * packed.shape[-1]]: split in float
    arithmetic (exact: every byte value and level is an fp16 integer), no integer bit ops. The
    halves are concatenated: for a table's few rows a token reads, unlike an expert stack's
    weights (`Int4Experts._halves`), that copy costs nothing."""
    p = packed.to(dtype)
    high = torch.floor(p * (1 / 16))
    low = p - 16 * high
    return torch.cat([low, high], dim=-1) - NIBBLE_OFFSET


class QuantizedTable(nn.Module):
    """A lookup table [rows, width] stored as symmetric int8 or 4-bit blocks of 32 along the
    width: Q [rows, width] int8 or packed [rows, width/2] uint8 (`pack_nibbles`), fp16 scales
    [rows, width/32]. `rows(ids)` gathers the chosen rows' Q and scales and dequantizes only
    those (fp32), so a token reads one row, as from a float table."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bits: int):
        super().__init__()
        self.q = nn.Parameter(q.contiguous(), requires_grad=False)
        self.scale = nn.Parameter(scale.contiguous(), requires_grad=False)
        self.bits = bits

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        q, scale = self.q[ids], self.scale[ids].float()
        levels = unpack_nibbles(q, torch.float32) if self.bits == 4 else q.float()
        blocks = scale.shape[-1]
        w = levels.unflatten(-1, (blocks, -1)) * scale.unsqueeze(-1)
        return w.flatten(-2)
