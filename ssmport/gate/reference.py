"""The gate's fp32 reference, computed before the candidate is loaded.

`reference_logits` gives the fp32 export-form module's logits after every token of the gate's
teacher-forced streams; `ReplayedReference` plays them back through the interface the gate
drives. So the gate never holds the fp32 model and the Core AI program at once, and a model
whose fp32 weights would not fit is computed layer by layer (`LayerStreamedReference`).
The same machinery computes two other forms of the module (`Form`): the fp32 module in
float64 (`FP64`, ssmport.gate.fp64: what an fp32 gate measures the fp32 reference's own
rounding against, its noise floor), and a 16-bit recipe's module with fp32 sums
(`recipe_with_fp32_sums`, ssmport.gate.accumulation: the recipe's own error, apart from this
runtime's fp16 sums) or with this runtime's sums (`recipe_with_runtime_sums`: the bundle's own
computation, and for the fp16 recipe the 16-bit gates' noise floor).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import numpy as np
import torch
from torch import nn

from ssmport.architectures import LoadedModel
from ssmport.architectures.base import Architecture
from ssmport.loader.checkpoint import TensorSource
from ssmport.errors import SsmportError
from ssmport.quant import Recipe, get_recipe
from ssmport.ops.matmul import FloatExperts, FloatMatmul
from ssmport.quant.plan import WeightBuilder
from ssmport.gate.accumulation import accumulate_in_fp32, runtime_fp16_sums
from ssmport.gate.fp64 import float64_math, to_float64
from ssmport.gate.torch_runner import TorchRunner
from ssmport.state import zero_states

# Above this many fp32 weight bytes the reference is streamed a few layers at a time
# (LayerStreamedReference) instead of built whole: a 1.5B model's fp32 module is 6.1 GB.
STREAM_REFERENCE_ABOVE = 1 << 30
# How many weight bytes one streamed group of layers may materialise (in the form's bytes per weight).
STREAM_GROUP_BYTES = 1 << 30


def fp32_weight_bytes(model: LoadedModel) -> int:
    return 4 * sum(math.prod(model.weights.shape(n)) for n in model.weights)


@dataclasses.dataclass(frozen=True)
class Form:
    """How a reference computes: its weights stored as `recipe` says, each built module passed
    through `prepare`, run inside `math()`; `bytes_per_weight` is what the streaming budgets count."""

    recipe: str | Recipe = "fp32"
    prepare: Callable[[nn.Module], nn.Module] = lambda module: module
    math: Callable[[], AbstractContextManager] = nullcontext
    bytes_per_weight: int = 4


FP32 = Form()
FP64 = Form(prepare=to_float64, math=float64_math, bytes_per_weight=8)  # built in fp32, cast up


def recipe_with_fp32_sums(recipe: str | Recipe) -> Form:
    """`recipe`'s stored weights, every 16-bit matmul on fp16-rounded inputs summed in fp32 (the
    fp32 twins hold the weights as fp32: 4 bytes each)."""
    return Form(recipe, accumulate_in_fp32)


def recipe_with_runtime_sums(recipe: str | Recipe) -> Form:
    """`recipe`'s stored weights, every fp16 matmul summed as this runtime sums it."""
    return Form(recipe, math=runtime_fp16_sums)


def reference_logits(
    model: LoadedModel,
    streams: list[list[int]],
    stream_layers: bool | None = None,
    on_token=None,
    form: Form = FP32,
) -> list[np.ndarray]:
    """The fp32 export-form module's logits (or another `form`'s) after every token of each
    stream, teacher-forced from zero state: one [len(stream), V] array per stream (float32;
    float64 for FP64). `stream_layers` None: streamed when the form's weights exceed
    STREAM_REFERENCE_ABOVE (and the architecture builds from blocks), else the whole
    TorchRunner. So any form holds at most that many weight bytes at once, plus one tensor
    while a module is prepared (cast up, or its matmuls swapped)."""
    if stream_layers is None:
        weight_bytes = fp32_weight_bytes(model) // 4 * form.bytes_per_weight
        stream_layers = weight_bytes > STREAM_REFERENCE_ABOVE and LayerStreamedReference.supports(model)
    if stream_layers:
        return LayerStreamedReference(model, form=form).logits(streams, on_token)
    runner = TorchRunner(model, form.recipe)
    form.prepare(runner.module)
    try:
        out = []
        for tokens in streams:
            runner.reset()
            with form.math():
                out.append(runner.step_each(tokens))
            if on_token:
                on_token(len(tokens))
        return out
    finally:
        runner.close()


class ReplayedReference:
    """The `Steppable` interface over precomputed logits (`reference_logits`): the gate's
    reference side, so the fp32 model is gone before the candidate is loaded."""

    def __init__(self, streams: list[list[int]], logits: list[np.ndarray]):
        self._streams = [(list(s), rows) for s, rows in zip(streams, logits)]
        self.tokens: list[int] = []

    def reset(self) -> None:
        self.tokens = []

    def step(self, token: int) -> np.ndarray:
        self.tokens.append(int(token))
        n = len(self.tokens)
        for tokens, rows in self._streams:
            if tokens[:n] == self.tokens:
                return rows[n - 1]
        raise SsmportError(f"the reference has no precomputed logits for tokens {self.tokens}")

    def feed(self, tokens: list[int]) -> np.ndarray:
        if not tokens:
            raise SsmportError("feed needs at least one token")
        for t in tokens:
            row = self.step(t)
        return row

    def close(self) -> None:
        self._streams = []


class LayerStreamedReference:
    """The fp32 export-form model (or another `Form` of it) computed layer-major, a few layers' weights at a time.

    Teacher forcing fixes every token in advance, and each layer is causal, so running a group
    of layers over all tokens of all streams before the next group gives the very numbers the
    token-major TorchRunner gives (the same blocks, the same M=1 calls, per-token carries such
    as RWKV-7's v_first kept between groups) while only that group's weights exist.

    Each group is built by the architecture's own `build_blocks`, over a source that reads the
    group's tensors and hands out shape-only meta tensors for all others, so nothing else is
    materialised. Which tensors a part (embedding, block i, head) is built from is found once
    by a build over meta tensors alone, noting which builder call each read precedes.
    """

    def __init__(self, model: LoadedModel, group_bytes: int = STREAM_GROUP_BYTES, form: Form = FP32):
        self.model, self.group_bytes, self.form = model, group_bytes, form
        self.parts = self._attribute()

    @staticmethod
    def supports(model: LoadedModel) -> bool:
        """Whether the architecture builds through `build_blocks` (the generic graph)."""
        return type(model.architecture).build_blocks is not Architecture.build_blocks

    def _build(self, source: TensorSource, builder: WeightBuilder):
        m = self.model
        with torch.no_grad():
            parts = m.architecture.build_blocks(m.config, source, builder)
        if parts is None:
            raise SsmportError(f"{m.architecture.name}: no build_blocks, so its reference cannot be streamed")
        embed, blocks, head = parts
        return [embed, *blocks, head]

    def _attribute(self) -> list[set[str]]:
        """The source names each part is built from."""
        reads: list[tuple[str, int]] = []
        builder = _CallTracingBuilder(get_recipe("fp32"), self.model.architecture.keeps_float)
        parts = self._build(_MetaWindow(self.model.weights, frozenset(), reads, builder), builder)
        names: list[set[str]] = []
        for part in parts:
            calls = {builder.call_of[id(t)] for t in _tensors(part) if id(t) in builder.call_of}
            names.append({n for n, call in reads if call in calls})
        return names

    def _groups(self) -> list[list[int]]:
        """Consecutive parts whose bytes (the form's per weight) fit the budget together (at
        least one each)."""
        shape = self.model.weights.shape
        groups: list[list[int]] = []
        used = 0
        for i, names in enumerate(self.parts):
            size = self.form.bytes_per_weight * sum(math.prod(shape(n)) for n in names)
            joins = groups and groups[-1][0] != 0 and i != len(self.parts) - 1  # blocks only, not the ends
            if joins and used + size <= self.group_bytes:
                groups[-1].append(i)
                used += size
            else:
                groups.append([i])
                used = size
        return groups

    def _materialise(self, indices: list[int]) -> list[nn.Module]:
        real = frozenset().union(*(self.parts[i] for i in indices))
        builder = _WindowBuilder.for_architecture(get_recipe(self.form.recipe), self.model.architecture)
        parts = self._build(_MetaWindow(self.model.weights, real, None, None), builder)
        chosen = [self.form.prepare(parts[i].eval()) for i in indices]
        del parts
        for i, part in zip(indices, chosen):
            if any(t.is_meta for t in _tensors(part)):
                raise SsmportError(f"{self.model.architecture.name}: part {i} of the model needs tensors its "
                                   "build did not read where expected; its reference cannot be streamed")  # fmt: skip
        return chosen

    def logits(self, streams: list[list[int]], on_token=None) -> list[np.ndarray]:
        """One [len(stream), V] array per stream (see `reference_logits`)."""
        from ssmport.graph import CausalLM, Step

        specs = self.model.architecture.state_specs(self.model.config, torch.float32)
        groups = self._groups()
        xs: list[list[torch.Tensor]] = []  # every token's residual rows [1, C], between groups
        carries = [[{} for _ in s] for s in streams]  # what blocks hand on per token (v_first)
        out: list[np.ndarray] = []
        for g, indices in enumerate(groups):
            parts = self._materialise(indices)
            with torch.no_grad(), self.form.math():
                if g == 0:  # the embedding
                    xs = [[parts[0](torch.tensor([t], dtype=torch.int32)) for t in s] for s in streams]
                elif g == len(groups) - 1:  # the final norm and LM head
                    out = [np.stack([parts[0](x).float().reshape(-1).numpy() for x in rows]) for rows in xs]
                else:
                    group = CausalLM(nn.Identity(), parts, nn.Identity(), _group_specs(specs, parts))
                    for s, tokens in enumerate(streams):
                        zero_states(group, group.specs)
                        for t in range(len(tokens)):
                            xs[s][t] = group.run_blocks(xs[s][t], Step(None, torch.tensor([t], dtype=torch.int32),
                                                                       carries[s][t]))  # fmt: skip
            del parts
            self.model.weights.release_pages()
            if on_token:  # the gate's bar counts tokens: each group is 1/len(groups) of every token
                on_token(sum(len(s) for s in streams) / len(groups))
        return out


def _tensors(module: nn.Module) -> list[torch.Tensor]:
    return [*module.parameters(), *module.buffers()]


def _group_specs(specs, blocks) -> list:
    """The states a run of blocks uses, each stacked over just those blocks."""
    out = []
    for spec in specs:
        count = sum(spec.name in b.states for b in blocks)
        if count:
            out.append(dataclasses.replace(spec, shape=(count, *spec.shape[1:])))
    return out


class _CallTracingBuilder(WeightBuilder):
    """A builder that notes which of its calls stored each tensor (by the tensor's id)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.call_of: dict[int, int] = {}
        self.calls = 0

    def _traced(self, stored):
        tensors = _tensors(stored) if isinstance(stored, nn.Module) else [stored]
        self.call_of.update((id(t), self.calls) for t in tensors)
        self.calls += 1
        return stored

    def matmul(self, *args, **kwargs):
        return self._traced(super().matmul(*args, **kwargs))

    def table(self, *args, **kwargs):
        return self._traced(super().table(*args, **kwargs))

    def vector(self, *args, **kwargs):
        return self._traced(super().vector(*args, **kwargs))


class _WindowBuilder(WeightBuilder):
    """The form's builder for the parts being materialised; a matmul of a part outside them (its
    weight a meta tensor) gets a shape-only float placeholder instead of being quantized."""

    def matmul(self, name, weight_in_out, role, out_dtype=torch.float32):
        if weight_in_out.is_meta:
            return FloatMatmul(weight_in_out, out_dtype)
        return super().matmul(name, weight_in_out, role, out_dtype)

    def experts(self, name, stack_in_out, role, rows_read):
        if stack_in_out.is_meta:
            return FloatExperts(stack_in_out.stacked())
        return super().experts(name, stack_in_out, role, rows_read)


class _MetaWindow(TensorSource):
    """`source` with only the names in `real` read; every other name is a meta tensor of its
    shape (no data). `reads` (optional) records (name, builder calls made so far) per read."""

    def __init__(self, source: TensorSource, real: frozenset[str], reads, builder):
        self.origin, self._source, self._real, self._reads, self._builder = source.origin, source, real, reads, builder

    def __getitem__(self, name: str) -> torch.Tensor:
        if self._reads is not None:
            self._reads.append((name, self._builder.calls))
        if name in self._real:
            return self._source[name]
        return torch.empty(self._source.shape(name), dtype=torch.float32, device="meta")

    def __iter__(self):
        return iter(self._source)

    def __len__(self) -> int:
        return len(self._source)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._source.shape(name)

    def dtype(self, name: str) -> torch.dtype:
        return self._source.dtype(name)


def shape_only(source: TensorSource) -> TensorSource:
    """`source`'s names and shapes, every tensor a meta tensor: a build from it records the plan
    of the real build without reading a weight (benchmarks/plan_sizes.py)."""
    return _MetaWindow(source, frozenset(), None, None)
