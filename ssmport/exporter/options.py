"""What an export is asked to do: every option of `ssmport.export` / `ssmport export`, checked
once, when the options are made, before any checkpoint is read (a Hub download can take
minutes)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ssmport.bundle import check_bundle_name
from ssmport.errors import SsmportError
from ssmport.layout import Layout
from ssmport.layouts import layout_named
from ssmport.gate.report import MAX_GATE_TOKENS
from ssmport.models.moe import EXPERT_FORMS
from ssmport.prefill import DEFAULT_CHUNK, check_chunk
from ssmport.quant import get_recipe
from ssmport.quant.budget import parse_size
from ssmport.state import STATE_DTYPES
from ssmport.verify import check_verify

DEFAULT_STATE_DTYPE = "fp32"  # see docs/quantization.md for the drift measurement behind it
EXPORT_GATE_STEPS = 8


@dataclass(frozen=True)
class ExportOptions:
    """`quant` None: the model's default recipe (ssmport.exporter.pipeline.default_quant). `prefill_chunk`
    None: a decode-only bundle (no "prefill"). `layout`: the bundle layout's name or object
    (ssmport.layout), read once into its object (ssmport.layouts.layout_named): after
    construction `options.layout` is a Layout. "apple": the functions, states and files
    Apple's engines load and drive (docs/apple-engines.md), with `apple_main` "decode" (one
    token per call, its default) or "chunk" (ssmport.apple.graph); the default "ssmport" is the
    M=1 decode graph + padded chunks. `context`: the positions a model with a KV cache holds
    (None: its config's default). `verify` K: a `verify` function for speculative decoding
    (None: none; docs/speculative.md says why that is the default). `experts`: how every
    function reads its tokens' routed experts (ssmport.models.moe: "gathered", the default, or
    "branched", faster on the Linux runtime, an `if` per expert). `profile_memory`: trace
    the peak RSS of every stage (ssmport.memory) into the manifest. `size_budget`: the asset's
    most bytes under quant "auto" (ssmport.quant.auto). `int8_tied_table`: whether a tied
    embedding reads the int8 LM head's levels instead of an fp16 table of its own (None: the
    recipe's default; ssmport.quant.tied). `gate_prefill`: whether the export gate feeds its
    prompt through `prefill` (None: fp32 bundles only; ssmport.exporter.pipeline.gate_runs_prefill).
    `weights`, `synthetic`, `seed`,
    `vocab`, `file`:
    how a preset or checkpoint spec is loaded (ssmport.loader.resolve.load_model)."""

    quant: str | None = None
    state_dtype: str | None = DEFAULT_STATE_DTYPE  # None: the default
    weights: str | Path | None = None
    synthetic: bool = False
    seed: int = 0
    vocab: str | Path | None = None
    file: str | None = None
    name: str | None = None
    overwrite: bool = False
    gate: bool = True
    gate_steps: int = EXPORT_GATE_STEPS
    # Whether the export gate also runs its prompt through `prefill`; None: fp32 bundles only
    # (ssmport.exporter.pipeline.gate_runs_prefill)
    gate_prefill: bool | None = None
    progress: bool = True
    prefill_chunk: int | None = DEFAULT_CHUNK
    layout: str | Layout = "ssmport"
    apple_main: str | None = None  # None: the apple layout's default; only with layout "apple"
    context: int | None = None
    profile_memory: bool = False
    size_budget: int | str | None = None  # bytes, or a size string ("3.5MB"); with quant "auto" only
    verify: int | None = None  # K: add the `verify` function checking K drafts a call (ssmport.verify)
    experts: str = "gathered"  # how decode reads a token's routed experts (ssmport.models.moe.EXPERT_FORMS)
    # A tied embedding read from the int8 LM head's levels (True) or kept as an fp16 table (False);
    # None: the recipe's default (`Recipe.int8_tied_table`; ssmport.quant.tied)
    int8_tied_table: bool | None = None

    def __post_init__(self) -> None:
        if self.state_dtype is None:
            object.__setattr__(self, "state_dtype", DEFAULT_STATE_DTYPE)
        if self.state_dtype not in STATE_DTYPES:
            raise SsmportError(f"unknown --state-dtype {self.state_dtype!r}; choose fp32 or fp16")
        if self.quant is not None:
            get_recipe(self.quant).with_int8_tied_table(self.int8_tied_table)  # before the checkpoint is read
        if (self.quant == "auto") != (self.size_budget is not None):
            raise SsmportError("--quant auto needs --size-budget SIZE (e.g. 3.5MB, 2.2GB)" if self.quant == "auto"
                               else "--size-budget applies to --quant auto only")  # fmt: skip
        if isinstance(self.size_budget, str):
            object.__setattr__(self, "size_budget", parse_size(self.size_budget))
        if self.size_budget is not None and (not isinstance(self.size_budget, int) or self.size_budget < 1):
            raise SsmportError(f"--size-budget must be a positive number of bytes (got {self.size_budget!r})")
        if self.gate and not 1 <= self.gate_steps <= MAX_GATE_TOKENS:
            bound = "at least 1" if self.gate_steps < 1 else f"at most {MAX_GATE_TOKENS:,}"
            raise SsmportError(f"--gate-steps must be {bound} (got {self.gate_steps:,}), or pass --no-gate")
        if self.gate and isinstance(self.context, int) and 1 <= self.context < self.gate_steps:
            # else found only by the gate, after the whole conversion
            raise SsmportError(f"--context {self.context} holds fewer positions than the export gate's "
                               f"{self.gate_steps} tokens (--gate-steps); give a larger --context, fewer "
                               "--gate-steps, or --no-gate")  # fmt: skip
        if self.gate_prefill and not self.gate:
            raise SsmportError("--gate-prefill needs the export gate; drop --no-gate")
        if self.gate_prefill and self.prefill_chunk is None:
            raise SsmportError("--gate-prefill needs the prefill function; drop --no-prefill")
        check_chunk(self.prefill_chunk)
        check_verify(self.verify)
        if self.experts not in EXPERT_FORMS:
            raise SsmportError(f"unknown --experts {self.experts!r}; choose {' or '.join(EXPERT_FORMS)}")
        object.__setattr__(self, "layout", layout_named(self.layout, self.apple_main))
        if self.name is not None:
            check_bundle_name(self.name)
