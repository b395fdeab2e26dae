"""Checkpoint -> Core AI decode bundle.

    build the export-form module under a recipe
    -> torch.export -> run_decompositions(get_decomp_table())
    -> TorchConverter (RELEASE, explicit input/output/state names)
    -> contract check on the converted IR (names, order, dtypes, one write per state)
    -> save the asset, the manifest, the tokenizer
    -> short teacher-forced gate on the Core AI runtime
    -> rename the finished bundle into place

Everything is built in a temp directory beside the target, so a failure leaves nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import hashlib
import json
import math
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ssmport.version import __version__
from ssmport._quiet import python_stdout_captured
from ssmport.architectures import LoadedModel
from ssmport.bundle import ASSET, TOKENIZER_DIR, Bundle, check_bundle_name, dir_bytes, staged_directory
from ssmport.contract import GraphSignature, check_contract, read_signature
from ssmport.errors import SsmportError
from ssmport.export_options import ExportOptions
from ssmport.files import check_free_space
from ssmport.interrupts import interrupts_deferred
from ssmport.layout import Layout
from ssmport.layouts import DEFAULT as DEFAULT_LAYOUT
from ssmport.layouts import layout_named
from ssmport.manifest import (
    AssetEntry,
    FunctionEntry,
    Manifest,
    PrefillEntry,
    RecipeEntry,
    StateEntry,
    TokenizerEntry,
)  # fmt: skip
from ssmport.memory import MemoryTrace, TracedStages, maxrss_mb, section
from ssmport.prefill import DEFAULT_CHUNK, PREFILL_FUNCTION
from ssmport.progress import Stages
from ssmport.quant import Recipe, get_recipe
from ssmport.quant.auto import AutoPlan
from ssmport.quant.plan import WeightBuilder, storage_key, summarize_plan
from ssmport.reproducible import (
    asset_metadata_json,
    content_id,
    creation_date,
    deterministic_names,
    name_folded_constants,
)  # fmt: skip
from ssmport.sources import load_model, source_paths, with_context
from ssmport.state import STATE_DTYPES, dtype_name
from ssmport.verify import VERIFY_FUNCTION

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
        if recipe.name == "auto":
            from ssmport.quant.auto import plan_auto

            with stages.stage("Measuring precision sensitivity (auto)"):
                auto = plan_auto(model, o.size_budget)
            recipe = auto.recipe
        chunk = o.prefill_chunk
        o.layout.check_export(model.architecture, chunk)
        final = Path(out) / check_bundle_name(o.name or f"{model.name}-{recipe.name}")
        with staged_directory(final, o.overwrite, protect=source_paths(model)) as tmp:
            manifest = _build_bundle(model, recipe, STATE_DTYPES[o.state_dtype], tmp, final.name, stages, chunk,
                                     o.layout, auto, o.verify)  # fmt: skip
            bundle = Bundle(tmp, manifest)
            headline = None
            if o.gate:
                from ssmport.gate.run import gate_bundle  # imports the runtime only when needed
                from ssmport.runtime.op_count import OpLog, count_ops, summarize

                # The decode count is the gate's last call (always a one-token `main` step): one
                # more call would cost as much as a gate step (488 s at rwkv7-7.2b int8keepproj).
                log = OpLog(keep=1)
                report = gate_bundle(
                    bundle, model, prompts=EXPORT_GATE_PROMPTS, steps=o.gate_steps, stages=stages,
                    profiler=log.profiler(),
                )  # fmt: skip
                headline = report.headline()
                counted = {"main": summarize(log.calls[-1])}
                # A full prefill chunk (and verify call) is counted only for fp32 bundles: this runtime emulates fp16
                # and dequantizes int8 on every call, so one 64-row chunk of qwen3.5-0.8b
                # int8keepproj took over 8 minutes here (`inspect --count-ops` counts it on demand).
                if recipe.name == "fp32" and (manifest.prefill is not None or manifest.verify is not None):
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
) -> Manifest:
    arch, cfg = model.architecture, model.config
    builder = WeightBuilder.for_architecture(recipe, arch, on_store=stages.advance)

    converted = convert(model, builder, state_dtype, stages, prefill_chunk, layout, verify)
    signature, specs = converted.decode, converted.specs

    with stages.stage("Writing asset"):
        check_free_space(out, summarize_plan(builder.plan_json())["total"] + ASSET_OVERHEAD, "the asset")
        _save_asset(converted, out / ASSET)
        with section("tokenizer"):
            tokenizer = _write_tokenizer(model, out)

    plan = builder.plan_json()
    plan_record = {"summary": summarize_plan(plan), "tensors": plan}
    if auto is not None:
        plan_record["auto"] = auto.record
        _check_auto_fit(auto, plan_record["summary"]["total"], dir_bytes(out / ASSET))
    manifest = Manifest(
        ssmport_version=__version__,
        bundle_id="",  # the content's hash, below
        name=name,
        architecture=arch.name,
        config=cfg.to_json(),
        source=_provenance(model),
        synthetic_weights=model.synthetic,
        recipe=RecipeEntry(recipe.name, recipe.description, dtype_name(state_dtype)),
        main=_function_entry(signature),
        states=tuple(StateEntry(s.name, s.shape, s.dtype, spec.layout, spec.kind, spec.max_context)
                     for s, spec in zip(signature.states, specs)),  # fmt: skip
        prefill=_rows_entry(converted, converted.prefill, converted.prefill_chunk),
        verify=_rows_entry(converted, converted.verify, converted.verify_rows),
        plan=plan_record,
        asset=AssetEntry(ASSET, dir_bytes(out / ASSET), files=_asset_file_hashes(out / ASSET)),
        tokenizer=tokenizer,
        notes=list(model.notes),
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


def _provenance(model: LoadedModel) -> dict:
    """The model's provenance, with the plugin that registered its architecture (if any), so
    that `ssmport gate` without it can say which one the bundle needs."""
    from ssmport.plugins import plugin_of

    plugin = plugin_of(model.architecture.name)
    return dict(model.provenance) | ({"plugin": plugin} if plugin else {})


@dataclass
class Converted:
    """A converted program and the signatures read back from its IR (checked)."""

    program: Any
    decode: GraphSignature
    prefill: GraphSignature | None  # None: a decode-only program
    prefill_chunk: int | None
    specs: list  # the states of both functions, as the layout stores them
    layout: Layout = DEFAULT_LAYOUT
    verify: GraphSignature | None = None  # with --verify: the function checking K drafts
    verify_rows: int | None = None


def convert(
    model: LoadedModel,
    builder: WeightBuilder,
    state_dtype: torch.dtype,
    stages: Stages | None = None,
    prefill_chunk: int | None = DEFAULT_CHUNK,
    layout: str | Layout = DEFAULT_LAYOUT,
    verify: int | None = None,
) -> Converted:
    """Build the decode module (and the prefill module, when the architecture has one and
    `prefill_chunk` is set) under `builder`'s recipe and convert them to one Core AI program:
    function "main" and function "prefill", sharing the weights, in `layout`'s form
    (ssmport.layout; a name is read by ssmport.layouts.layout_named): "apple", the functions
    Apple's engines drive (ssmport.apple.graph), over the same blocks.

    `verify` K: a third function, "verify", checking K drafted tokens per call (ssmport.verify).

    Every function's signature is read from the IR and checked against the contract.
    """
    stages = stages or Stages(enabled=False)
    layout = layout_named(layout)
    arch, cfg = model.architecture, model.config
    specs = arch.state_specs(cfg, state_dtype)
    total = sum(math.prod(model.weights.shape(n)) for n in model.weights)
    with stages.stage("Building weights", total=total), _releasing_pages(model.weights, builder):
        with torch.no_grad():
            module = arch.build_decode(cfg, model.weights, builder, state_dtype).eval()
            prefill = arch.build_prefill(cfg, module, prefill_chunk) if prefill_chunk else None
    _check_buffers(module, specs)
    if prefill is not None:
        prefill.eval()
        _check_buffers(prefill, specs)
    functions, specs = layout.functions(arch, cfg, specs, module, prefill, prefill_chunk, verify)
    del module, prefill
    _return_freed_memory()  # the fp32 temporaries of building; keeps the conversion peak low

    with stages.stage("torch.export"):
        programs = [_export_program(f.module, f.example, f.name, f.dynamic_shapes) for f in functions]
        # torch.export of a while_loop (ops.scan) goes through dynamo, whose code cache then keeps the
        # traced module (and so every weight) alive after the export is done.
        torch._dynamo.reset()

    with stages.stage("Converting to Core AI"):
        state_names = [s.name for s in specs]
        with python_stdout_captured(), deterministic_names():  # the same graph, the same names
            converter = _releasing_converter(builder, model.weights.storage_keys())
            for f, ep in zip(functions, programs):
                converter = converter.add_exported_program(
                    ep, input_names=list(f.inputs), output_names=list(f.outputs), state_names=state_names,
                    **({} if f.name == "main" else {"entrypoint_name": f.name}),
                )  # fmt: skip
            with section("TorchConverter.to_coreai"):
                program = converter.to_coreai()
            name_folded_constants(program)
        contracts = [(f.name, f.inputs, f.outputs) for f in functions]
        with section("release torch module"):
            del functions, programs, converter
            _return_freed_memory()
            model.weights.release_pages()  # a checkpoint's fp32 tensors are stored as they are: re-read here
        signatures = {}
        with section("read IR signature"):
            for name, inputs, outputs in contracts:
                signatures[name] = read_signature(program, name)
                check_contract(signatures[name], inputs, outputs, specs)
    prefill_sig = signatures.get(PREFILL_FUNCTION)
    chunk = None if prefill_sig is None else layout.prefill_rows(arch, specs, prefill_chunk)
    verify_sig = signatures.get(VERIFY_FUNCTION)
    return Converted(program, signatures["main"], prefill_sig, chunk, specs, layout, verify_sig,
                     verify if verify_sig is not None else None)  # fmt: skip


# While building, a checkpoint's memory-mapped pages are let go of every this many elements
# stored (TensorSource.release_pages): the file is read once, never held whole.
RELEASE_PAGES_EVERY = 1 << 26


@contextlib.contextmanager
def _releasing_pages(weights, builder: WeightBuilder):
    stored, on_store = 0, builder.on_store

    def counted(n: int) -> None:
        nonlocal stored
        stored += n
        if stored >= RELEASE_PAGES_EVERY:
            weights.release_pages()
            stored = 0
        if on_store:
            on_store(n)

    builder.on_store = counted
    try:
        yield
    finally:
        builder.on_store = on_store
        weights.release_pages()


# While converting, the freed weights' heap pages go back to the OS every this many bytes:
# glibc keeps them otherwise, and the converter's own allocations do not reuse them.
TRIM_EVERY_BYTES = 128 << 20


def _releasing_converter(builder: WeightBuilder, keep: frozenset[int]):
    """A RELEASE-mode TorchConverter that frees each weight's torch storage as soon as the
    converter has copied it into the program, so a conversion holds about one copy of the
    weights instead of two (the module's and the program's). Freed: what `builder` stored,
    except the storages in `keep` (an in-memory source's own tensors, stored as they are) and
    storages that cannot be resized (memory-mapped checkpoint tensors). A weight both
    functions use is copied once; the second function reuses its constant.

    It overrides coreai-torch 0.4.3's private `_constant_from_tensor` (the version is pinned);
    where that is absent, the plain converter (twice the memory, same program)."""
    from coreai_torch import TorchConverter

    release = TorchConverter.Mode.RELEASE
    if not hasattr(TorchConverter, "_constant_from_tensor"):
        return TorchConverter(mode=release)
    from coreai._compiler.dialects import coreai

    class ReleasingConverter(TorchConverter):
        def _constant_from_tensor(self, tensor: torch.Tensor):
            storage = tensor.untyped_storage()
            if (type(tensor) not in (torch.Tensor, torch.nn.Parameter) or not builder.stored(tensor)
                    or storage_key(tensor) in keep or not storage.resizable()):  # fmt: skip
                return super()._constant_from_tensor(tensor)
            key = (storage_key(tensor), tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()),
                   tensor.dtype)  # fmt: skip
            attr = copied.get(key)
            if attr is not None:
                return coreai.ConstantOp(value=attr).result
            # The converter reads the data through .numpy(), which pins a storage's size for
            # good: hand it a copy (one tensor at a time), so the original can still be freed.
            value = super()._constant_from_tensor(tensor.clone())
            copied[key] = value.owner.attributes["value"]
            freed[0] += storage.nbytes()
            storage.resize_(0)  # the program holds the only copy now
            if freed[0] >= TRIM_EVERY_BYTES:  # glibc keeps freed heap pages until trimmed
                _trim_heap()
                freed[0] = 0
            return value

    copied: dict[tuple, Any] = {}
    freed = [0]
    return ReleasingConverter(mode=release)


def _export_program(module: torch.nn.Module, example: tuple[torch.Tensor, ...], function: str, dynamic_shapes=None):
    import coreai_torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch-internal pytree deprecations
        with section(f"torch.export.export {function}"):
            ep = torch.export.export(module, example, dynamic_shapes=dynamic_shapes)
        with section(f"run_decompositions {function}"):
            return ep.run_decompositions(coreai_torch.get_decomp_table())


def _save_asset(converted: Converted, path: Path) -> None:
    """`program.save_asset(path)` in its own steps, so that the program (the one copy of the
    weights left in memory) is released once its bytecode is on disk, before the bytecode is
    hashed: coreai-core's save_asset hashes `read_bytes()` of the whole file while the program
    is still alive, two copies of the weights at once. The steps and private names are
    coreai-core 1.0.0b3's (pinned); where they are absent, save_asset itself. Either way
    `converted.program` is None afterwards."""
    program = converted.program
    try:
        from coreai.authoring.asset import _COREAI_PRODUCER, OSVersion
        from coreai.runtime import _AIModelAsset

        steps = hasattr(_AIModelAsset, "_create") and hasattr(program, "_save_bytecode")
    except ImportError:
        steps = False
    if not steps:
        with section("save_asset"):
            program.save_asset(path)
        converted.program = program = None
        _return_freed_memory()
        _settle_metadata(path)
        return

    def stamp(meta) -> None:
        meta.creation_date = creation_date()  # None unless SOURCE_DATE_EPOCH: ssmport.reproducible
        meta._producer = _COREAI_PRODUCER

    path.mkdir(parents=True)
    asset = _AIModelAsset._create(path=str(path), metadata=None)
    with section("serialize bytecode"):
        program._save_bytecode(asset._program_bytecode_path, minimum_os=OSVersion.v27)
    with section("release program"):
        converted.program = program = None
        _return_freed_memory()
    asset.update_metadata(updates=stamp)
    with section("hash bytecode"), open(asset._program_bytecode_path, "rb") as f:
        asset._program_hash_path.write_bytes(hashlib.file_digest(f, "sha256").digest())
    _settle_metadata(path)


def _settle_metadata(asset: Path) -> None:
    """The asset's metadata.json, written again with sorted keys (the asset writer's order
    changes from process to process) and the creation date of ssmport.reproducible."""
    meta = asset / "metadata.json"
    data = json.loads(meta.read_text())
    date = creation_date()
    if date is None:
        data.pop("creationDate", None)  # save_asset (the fallback above) stamps the clock
    meta.write_text(asset_metadata_json(data))


def _function_entry(sig: GraphSignature) -> FunctionEntry:
    return FunctionEntry(sig.function, sig.inputs, sig.outputs)


def _rows_entry(converted: Converted, sig: GraphSignature | None, chunk: int | None) -> PrefillEntry | None:
    """The entry of a function over rows (prefill, verify: same states as "main"), or None
    where the bundle has no such function."""
    if sig is None:
        return None
    entry = _function_entry(sig)
    return PrefillEntry(entry.function, entry.inputs, entry.outputs, chunk, converted.layout.padding)


def _check_buffers(module: torch.nn.Module, specs) -> None:
    got = [(n, tuple(b.shape), b.dtype) for n, b in module.named_buffers() if "." not in n]
    want = [(s.name, s.shape, s.dtype) for s in specs]
    if got != want:
        raise SsmportError(f"decode module states {got} differ from the declared {want}")


def _check_tokenizer_files(model: LoadedModel) -> None:
    """The tokenizer_config.json and chat template that will travel with a tokenizer.json
    must be readable: found only when writing the bundle, they failed the export at its end."""
    from ssmport.tokenizers import HF_JSON_KIND, tokenizer_kind

    if model.vocab_path is not None and tokenizer_kind(model.vocab_path) == HF_JSON_KIND:
        from ssmport.tokenizers.chat_template import read_template

        read_template(model.vocab_path.parent)


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


def _asset_file_hashes(asset: Path) -> dict[str, str]:
    from ssmport.runtime.lowering import asset_file_hashes  # the runtime package loads coreai

    return asset_file_hashes(asset)


def _return_freed_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc keeps them otherwise)."""
    gc.collect()
    _trim_heap()


def _trim_heap() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass

