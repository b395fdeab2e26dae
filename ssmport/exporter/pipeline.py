"""Checkpoint -> Core AI decode bundle.

    load the model (ssmport.loader.resolve)
    -> convert (ssmport.exporter.convert): build the export-form modules under a recipe, the
       layout's functions, torch.export, TorchConverter, the contract checked on the IR
    -> save the asset (ssmport.exporter.asset), the tokenizer, the manifest, the layout's files
    -> short teacher-forced gate on the Core AI runtime (ssmport.gate.run)
    -> rename the finished bundle into place

Everything is built in a temp directory beside the target, so a failure leaves nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ssmport.architectures import LoadedModel
from ssmport.bundle import ASSET, TOKENIZER_DIR, Bundle, check_bundle_name, dir_bytes, staged_directory
from ssmport.errors import SsmportError
from ssmport.exporter.asset import asset_file_hashes, save_asset
from ssmport.exporter.contract import GraphSignature
from ssmport.exporter.convert import Converted, convert
from ssmport.exporter.options import ExportOptions
from ssmport.files import check_free_space
from ssmport.interrupts import interrupts_deferred
from ssmport.layout import Layout
from ssmport.layouts import DEFAULT as DEFAULT_LAYOUT
from ssmport.manifest import (
    AssetEntry,
    DraftEntry,
    FunctionEntry,
    Manifest,
    PrefillEntry,
    RecipeEntry,
    TokenizerEntry,
)  # fmt: skip
from ssmport.memory import MemoryTrace, TracedStages, maxrss_mb, section
from ssmport.models.moe import GATHERED
from ssmport.progress import Stages
from ssmport.quant import Recipe, get_recipe
from ssmport.quant.auto import AutoPlan
from ssmport.quant.plan import WeightBuilder, plan_notes, summarize_plan
from ssmport.quant.recipes import INT8_TIED_TABLE
from ssmport.reproducible import content_id
from ssmport.loader.resolve import load_model, source_paths, with_context
from ssmport.state import STATE_DTYPES, dtype_name
from ssmport.version import __version__

EXPORT_GATE_PROMPTS = 1
ASSET_OVERHEAD = 1 << 20  # the asset's graph and metadata beside the weights the plan counts


@dataclass
class ExportResult:
    path: Path
    manifest: Manifest
    gate_headline: str | None
    memory: MemoryTrace | None = None  # with profile_memory
    # seconds, stage_seconds, peak_rss_mb: kept out of the manifest (a bundle is a function of
    # its inputs, ssmport.reproducible) unless profile_memory asks for the measurements there
    timings: dict[str, Any] | None = None


def default_quant(model: LoadedModel) -> str:
    """int8keepproj for real weights (the phone-sized recipe); fp32 for synthetic demos,
    whose job is a fast, exact run on this machine's runtime."""
    return "fp32" if model.synthetic else "int8keepproj"


def export(spec: str | Path | LoadedModel, out: str | Path, options: ExportOptions | None = None,
           **kwargs: Any) -> ExportResult:  # fmt: skip
    """Export `spec` (preset, checkpoint path, Hub repo, or an already loaded model) as a
    bundle under directory `out`, as `options` say (or the ExportOptions fields given as
    keyword arguments: `export(spec, out, quant="fp32", layout="apple")`)."""
    if options is None:
        options = ExportOptions(**kwargs)
    elif kwargs:
        raise TypeError("pass either an ExportOptions or its fields as keyword arguments, not both")
    return _export(spec, out, options)


def _export(spec: str | Path | LoadedModel, out: str | Path, o: ExportOptions) -> ExportResult:
    started = time.perf_counter()
    trace = MemoryTrace() if o.profile_memory else contextlib.nullcontext()
    with interrupts_deferred(), trace, TracedStages(enabled=o.progress) as stages:  # see ssmport.interrupts
        with stages.stage("Reading checkpoint"):
            if isinstance(spec, LoadedModel):
                model = spec
            else:
                model = load_model(str(spec), weights=o.weights, synthetic=o.synthetic, seed=o.seed, vocab=o.vocab,
                                   file=o.file, display=stages)  # fmt: skip
            if o.context is not None:
                model = with_context(model, o.context)
        _check_tokenizer_files(model)  # before the heavy work, naming the user's file, not the staging copy
        recipe, auto = get_recipe(o.quant or default_quant(model)), None
        recipe = recipe.with_int8_tied_table(o.int8_tied_table)
        if recipe.name == "auto":
            from ssmport.quant.auto import plan_auto

            with stages.stage("Measuring precision sensitivity (auto)"):
                auto = plan_auto(model, o.size_budget, share_tied_table=o.int8_tied_table is not False)
            recipe = auto.recipe
        chunk = o.prefill_chunk
        o.layout.check_export(model.architecture, chunk)
        final = Path(out) / check_bundle_name(o.name or f"{model.name}-{recipe.name}")
        with staged_directory(final, o.overwrite, protect=source_paths(model)) as tmp:
            manifest = _build_bundle(model, recipe, STATE_DTYPES[o.state_dtype], tmp, final.name, stages, chunk,
                                     o.layout, auto, o.verify, o.experts,
                                     require_tied_table=bool(o.int8_tied_table) and auto is None)  # fmt: skip
            bundle = Bundle(tmp, manifest)
            if o.experts != GATHERED:
                manifest.export["experts"] = o.experts  # every function's expert form (--experts)
            # the gate rebuilds this form; an `auto` plan's choice is its plan's (the table's `shares`)
            if auto is None and recipe.int8_tied_table != get_recipe(recipe.name).int8_tied_table:
                manifest.export[INT8_TIED_TABLE] = recipe.int8_tied_table
            headline = None
            if o.gate:
                from ssmport.gate.run import gate_bundle  # imports the runtime only when needed
                from ssmport.runtime.op_count import OpLog, count_ops, summarize

                # The decode count is the gate's last call (always a one-token `main` step): one
                # more call would cost as much as a gate step (488 s at rwkv7-7.2b int8keepproj).
                log = OpLog(keep=1)
                report = gate_bundle(
                    bundle, model, prompts=EXPORT_GATE_PROMPTS, steps=o.gate_steps, stages=stages,
                    profiler=log.profiler(), prefill=gate_runs_prefill(recipe, o.gate_prefill),
                )  # fmt: skip
                headline = report.headline()
                counted = {"main": summarize(log.calls[-1])}
                # A full prefill chunk (and verify call) is counted only where it is cheap here
                # (`inspect --count-ops` counts it on demand).
                if chunk_is_cheap_here(recipe) and (manifest.prefill is not None or manifest.verify is not None):
                    counted |= count_ops(bundle, main=False)
                manifest.export["runtime_ops"] = {f: c.to_json() for f, c in counted.items()}
                if manifest.verify is not None:
                    from ssmport.gate.checks import check_against_main

                    manifest.export["verify_vs_main_rel_delta"] = check_against_main(bundle)
            timings = {"stage_seconds": {k: round(v, 2) for k, v in stages.times.items()},
                       "seconds": round(time.perf_counter() - started, 2)}  # fmt: skip
            if o.profile_memory:
                trace.finish()
                manifest.export |= timings | {"memory": trace.to_json()}
            timings["peak_rss_mb"] = round(trace.peak_mb if o.profile_memory else maxrss_mb(), 1)
            if o.profile_memory:
                manifest.export["peak_rss_mb"] = timings["peak_rss_mb"]
            bundle.save_manifest()
    return ExportResult(final, manifest, headline, trace if o.profile_memory else None, timings)


def chunk_is_cheap_here(recipe: Recipe) -> bool:
    """Whether a many-row call (a prefill chunk, a verify call) of the recipe's bundle is cheap
    on this runtime: only an fp32 bundle's. The runtime emulates 16-bit sums element by element
    (~48 ns a multiply-add, docs/quantization.md), so a 16-bit bundle's padded 64-row chunk
    costs as much as 64 decode calls: 3 min 12 s of rwkv7-0.1b int8keepproj's export gate
    against 69 s for 8 decode calls, and over 22 minutes at 1.5B against ~2 minutes a decode call."""
    return recipe.name == "fp32"


def gate_runs_prefill(recipe: Recipe, asked: bool | None) -> bool:
    """Whether the export gate feeds its prompt through `prefill` (`asked`: --gate-prefill /
    --no-gate-prefill; None: where the chunk is cheap here). The other gates check `main` only,
    and say so (GateReport.not_run)."""
    return chunk_is_cheap_here(recipe) if asked is None else asked


def _build_bundle(
    model: LoadedModel,
    recipe: Recipe,
    state_dtype: torch.dtype,
    out: Path,
    name: str,
    stages: Stages,
    prefill_chunk: int | None,
    layout: Layout = DEFAULT_LAYOUT,
    auto: AutoPlan | None = None,
    verify: int | None = None,
    experts: str = GATHERED,
    require_tied_table: bool = False,
) -> Manifest:
    arch, cfg = model.architecture, model.config
    builder = WeightBuilder.for_architecture(recipe, arch, on_store=stages.advance)

    converted = convert(model, builder, state_dtype, stages, prefill_chunk, layout, verify, experts, require_tied_table)
    signature, specs = converted.decode, converted.specs

    with stages.stage("Writing asset"):
        check_free_space(out, summarize_plan(builder.plan_json())["total"] + ASSET_OVERHEAD, "the asset")
        save_asset(converted, out / ASSET)
        with section("tokenizer"):
            tokenizer = _write_tokenizer(model, out)

    plan = builder.plan_json()
    plan_record = {"summary": summarize_plan(plan), "tensors": plan}
    if auto is not None:
        plan_record["auto"] = auto.record
        _check_auto_fit(auto, plan_record["summary"]["total"], dir_bytes(out / ASSET))
    provenance = _provenance(model, converted.draft is not None)
    manifest = Manifest(
        ssmport_version=__version__,
        bundle_id="",  # the content's hash, below
        name=name,
        architecture=arch.name,
        config=cfg.to_json(),
        source=provenance,
        synthetic_weights=model.synthetic,
        recipe=RecipeEntry(recipe.name, recipe.description, dtype_name(state_dtype)),
        main=_function_entry(signature),
        states=tuple(spec.entry(s.shape) for s, spec in zip(signature.states, specs)),
        prefill=_rows_entry(converted, converted.prefill, converted.prefill_chunk),
        verify=_rows_entry(converted, converted.verify, converted.verify_rows),
        draft=_draft_entry(converted),
        plan=plan_record,
        asset=AssetEntry(ASSET, dir_bytes(out / ASSET), files=asset_file_hashes(out / ASSET)),
        tokenizer=tokenizer,
        notes=_notes(model, provenance) + plan_notes(recipe, plan_record["summary"]),
        layout=layout.name,
    )
    manifest.bundle_id = content_id(manifest.to_json())
    layout.write_files(out, manifest, model)
    Bundle(out, manifest).save_manifest()
    return manifest


def _check_auto_fit(auto: AutoPlan, plan_bytes: int, asset_bytes: int) -> None:
    """The asset an `auto` plan made is within its budget, and the plan is what auto counted."""
    if plan_bytes != auto.plan_bytes:  # a weight stored by a path auto does not count: a bug
        raise SsmportError(f"internal: auto counted {auto.plan_bytes:,} bytes of weights, the plan holds {plan_bytes:,}")
    if asset_bytes > auto.budget:
        raise SsmportError(f"the asset came to {asset_bytes:,} bytes, {asset_bytes - auto.budget:,} over "
                           f"--size-budget: its graph took {asset_bytes - plan_bytes:,} bytes beside the weights, "
                           f"more than the {auto.reserve:,} auto reserves; give a budget that much larger")  # fmt: skip


def _provenance(model: LoadedModel, draft: bool = False) -> dict:
    """The model's provenance, with the plugin that registered its architecture (if any), so
    that `ssmport gate` without it can say which one the bundle needs. `draft`: the bundle
    carries the checkpoint's draft head, which is then no longer a skipped group."""
    from ssmport.plugins import plugin_of

    plugin = plugin_of(model.architecture.name)
    provenance = dict(model.provenance) | ({"plugin": plugin} if plugin else {})
    skipped = provenance.get("skipped_tensors")
    if draft and skipped:
        skipped = {group: v for group, v in skipped.items() if group != model.architecture.draft_tensors}
        provenance["skipped_tensors"] = skipped
        if not skipped:
            del provenance["skipped_tensors"]
    return provenance


def _function_entry(sig: GraphSignature) -> FunctionEntry:
    return FunctionEntry(sig.function, sig.inputs, sig.outputs)


def _rows_entry(converted: Converted, sig: GraphSignature | None, chunk: int | None) -> PrefillEntry | None:
    """The entry of a function over rows (prefill, verify: same states as "main"), or None
    where the bundle has no such function."""
    if sig is None:
        return None
    entry = _function_entry(sig)
    return PrefillEntry(entry.function, entry.inputs, entry.outputs, chunk, converted.layout.padding)


def _notes(model: LoadedModel, provenance: dict) -> list[str]:
    """The model's notes, their line of skipped groups as the bundle's `provenance` has them
    (without the draft head's group when the head is exported)."""
    before, after = model.provenance.get("skipped_tensors"), provenance.get("skipped_tensors")
    if before == after:
        return list(model.notes)
    from ssmport.loader.resolve import skipped_note

    old = skipped_note(before) if before else None
    notes = [n for n in model.notes if n != old]
    return notes + [skipped_note(after)] if after else notes


def _draft_entry(converted: Converted) -> DraftEntry | None:
    sig = converted.draft
    if sig is None:
        return None
    states = tuple(spec.entry(s.shape) for s, spec in zip(sig.states, converted.draft_specs))
    return DraftEntry(sig.function, sig.inputs, sig.outputs, converted.verify_rows, converted.layout.padding, states)


def _check_tokenizer_files(model: LoadedModel) -> None:
    """The tokenizer_config.json and chat template that will travel with a tokenizer.json
    must be readable (found only when writing the bundle, they failed the export at its end),
    and the template must render (else only `ssmport chat` refused it, after the export)."""
    from ssmport.tokenizers import HF_JSON_KIND, tokenizer_kind

    if model.vocab_path is not None and tokenizer_kind(model.vocab_path) == HF_JSON_KIND:
        from ssmport.tokenizers.chat_template import check_renders

        check_renders(model.vocab_path.parent)


def _write_tokenizer(model: LoadedModel, out: Path) -> TokenizerEntry | None:
    """World vocabs are re-exported as a verified vocab.tsv; a tokenizer.json is copied as is."""
    if model.vocab_path is None:
        return None
    from ssmport.tokenizers import HF_JSON_KIND, HF_TOKENIZER_FILENAME, WORLD_KIND, tokenizer_kind

    (out / TOKENIZER_DIR).mkdir()
    config = template = None
    if tokenizer_kind(model.vocab_path) == HF_JSON_KIND:
        from ssmport.tokenizers.chat_template import CONFIG_FILE, TEMPLATE_FILE, read_template
        from ssmport.tokenizers.hf_json import hf_json_vocab_size

        target = out / TOKENIZER_DIR / HF_TOKENIZER_FILENAME
        shutil.copyfile(model.vocab_path, target)
        kind, sha256, entries = HF_JSON_KIND, hashlib.sha256(target.read_bytes()).hexdigest(), hf_json_vocab_size(target)
        # The checkpoint's tokenizer_config.json (special tokens, chat template) and a separate
        # chat_template.jinja travel with it, byte for byte: `ssmport chat` renders them.
        for extra in (CONFIG_FILE, TEMPLATE_FILE):
            if (model.vocab_path.parent / extra).is_file():
                shutil.copyfile(model.vocab_path.parent / extra, out / TOKENIZER_DIR / extra)
        if (out / TOKENIZER_DIR / CONFIG_FILE).is_file():
            config = f"{TOKENIZER_DIR}/{CONFIG_FILE}"
        found = read_template(out / TOKENIZER_DIR)
        template = None if found is None else f"{TOKENIZER_DIR}/{found[2].name}"
    else:
        from ssmport.tokenizers import export_vocab_tsv

        target = out / TOKENIZER_DIR / "vocab.tsv"
        info = export_vocab_tsv(model.vocab_path, target)
        kind, sha256, entries = WORLD_KIND, info.sha256, info.entries
    return TokenizerEntry(kind, f"{TOKENIZER_DIR}/{target.name}", sha256, entries, model.vocab_origin, config, template)


