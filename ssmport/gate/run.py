"""Run a bundle's teacher-forced gate and record it in the bundle."""

from __future__ import annotations

import time

import torch

from ssmport.architectures import LoadedModel
from ssmport.bundle import GATE, Bundle, write_json_atomic
from ssmport.gate.reference import (FP64, ReplayedReference, recipe_with_fp32_sums, recipe_with_runtime_sums,
                                    reference_logits)
from ssmport.manifest import GateSummary
from ssmport.memory import section
from ssmport.gate.report import GateReport, default_prompts, run_gate, streams_max_abs_delta
from ssmport.progress import Stages
from ssmport.quant.recipes import exported_recipe, gate_thresholds
from ssmport.runtime import Runner
from ssmport.runtime.lowering import ensure_lowered
from ssmport.loader.resolve import rebuild_bundle_source

DEFAULT_PROMPTS = 3
DEFAULT_STEPS = 32


def bundle_tokenizer(bundle: Bundle):
    if bundle.vocab_path is None:
        return None
    from ssmport.tokenizers import load_tokenizer

    return load_tokenizer(bundle.vocab_path)


def gate_bundle(
    bundle: Bundle,
    model: LoadedModel | None = None,
    *,
    prompts: int = DEFAULT_PROMPTS,
    steps: int = DEFAULT_STEPS,
    token_streams: list[list[int]] | None = None,
    weights=None,
    stages: Stages | None = None,
    record: bool = True,
    profiler=None,
    prefill: bool = True,
) -> GateReport:
    """Gate `bundle` against the fp32 torch reference built from its source weights.

    The reference's logits for every stream are computed first (a large model's layer by
    layer, see `ssmport.gate.reference.reference_logits`) and its weights released; then the bundle
    is lowered and loaded, so the gate's peak is the larger of the two, not their sum.
    `profiler`: a `coreai.runtime.Profiler` the bundle is loaded with (the export counts the
    ops of the gate's own calls rather than load and call the bundle once more).

    A 16-bit recipe's report also shows the recipe's own error apart from this runtime's: its
    torch module over the same stored weights with fp32 sums, vs the fp32 reference
    (`GateReport.set_recipe_split`), and the bundle's distance from the same module with this
    runtime's sums (its twin; neither for `auto`, whose per-tensor plan is not rebuilt here). Its
    limit takes the 16-bit noise floor: the fp16 recipe's module with this runtime's sums vs the
    fp32 reference (the fp16 recipe's twin is that module: one run).

    `prefill` False: every token through `main`; a bundle that has a prefill function records it
    as not run (the export gate of a 16-bit bundle, ssmport.exporter.pipeline.gate_runs_prefill).

    A recipe whose thresholds have a `floor_factor` (fp32) gets the same reference in float64
    too, computed the same way before the bundle loads (its weights twice the fp32 ones', so
    streamed above half the size), and is judged against it (ssmport.gate.report)."""
    m = bundle.manifest
    recipe = exported_recipe(m.recipe.name, m.export)
    if model is None:
        model = rebuild_bundle_source(m, weights)
    if token_streams is None:
        token_streams = default_prompts(
            model.config.vocab_size, prompts, steps, tokenizer=bundle_tokenizer(bundle)
        )
    stages = stages or Stages(enabled=False)
    total = sum(len(s) for s in token_streams)
    thresholds = gate_thresholds(recipe, m.recipe.state_dtype, m.main.outputs[0].dtype)
    seconds: dict[str, float] = {}
    # The references first, then the candidate: they never hold memory at once.
    with stages.stage("fp32 reference", total=total):
        start = time.perf_counter()
        fp32_logits = reference_logits(model, token_streams, on_token=stages.advance)
        reference = ReplayedReference(token_streams, fp32_logits)
        seconds["fp32_reference_s"] = time.perf_counter() - start
    recipe_only = twin = floor16 = None
    if recipe.float_dtype == torch.float16 and "auto" not in m.plan:
        with stages.stage("the recipe in torch (same stored weights, fp32 sums)", total=total):
            start = time.perf_counter()
            recipe_only = reference_logits(model, token_streams, on_token=stages.advance,
                                           form=recipe_with_fp32_sums(recipe))  # fmt: skip
            seconds["recipe_fp32_sums_s"] = time.perf_counter() - start
        with stages.stage("the recipe in torch (same stored weights, this runtime's sums)", total=total):
            start = time.perf_counter()
            twin_logits = reference_logits(model, token_streams, on_token=stages.advance,
                                           form=recipe_with_runtime_sums(recipe))  # fmt: skip
            twin = ReplayedReference(token_streams, twin_logits)
            seconds["recipe_runtime_sums_s"] = time.perf_counter() - start
        if recipe.name == "fp16":
            floor16 = twin_logits
    if thresholds.runtime_floor_factor and floor16 is None:
        with stages.stage("fp16 reference with this runtime's sums (the 16-bit noise floor)", total=total):
            start = time.perf_counter()
            floor16 = reference_logits(model, token_streams, on_token=stages.advance, form=recipe_with_runtime_sums("fp16"))
            seconds["fp16_runtime_sums_s"] = time.perf_counter() - start
    floor16_abs = None if floor16 is None else streams_max_abs_delta(floor16, fp32_logits)
    exact = None
    if thresholds.floor_factor:
        with stages.stage("fp64 reference (the fp32 reference's noise floor)", total=total):
            start = time.perf_counter()
            exact = ReplayedReference(token_streams, reference_logits(model, token_streams, on_token=stages.advance,
                                                                      form=FP64))  # fmt: skip
            seconds["fp64_reference_s"] = time.perf_counter() - start
    with stages.stage("Loading on Core AI runtime"):
        with section("lowering"):
            ensure_lowered(bundle)
        with section("load lowered model"):
            candidate = Runner(bundle, profiler=profiler, prefill=prefill)
    try:
        with stages.stage(f"Gate ({total} teacher-forced steps)", total=total):
            report = run_gate(
                candidate, reference, token_streams, recipe.name, thresholds,
                synthetic=model.synthetic, on_step=stages.advance, exact=exact,
                twin=twin, runtime_floor_abs=floor16_abs,
            )  # fmt: skip
    finally:
        candidate.close()
        reference.close()
        if twin is not None:
            twin.close()
        if exact is not None:
            exact.close()
    report.reference_seconds = seconds
    if not prefill and m.prefill is not None:
        report.not_run = ["prefill"]
    if recipe_only is not None:
        report.set_recipe_split(fp32_logits, recipe_only)
    if record:
        write_json_atomic(bundle.path / GATE, report.to_json())
        bundle.manifest.gate = GateSummary(**report.summary(), transcript=GATE)
        bundle.save_manifest()
    return report
