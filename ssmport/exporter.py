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

import ctypes
import gc
import hashlib
import math
import resource
import shutil
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ssmport import __version__
from ssmport._quiet import python_stdout_captured
from ssmport.architectures import LoadedModel
from ssmport.architectures.base import INPUT_NAMES, OUTPUT_NAMES
from ssmport.bundle import ASSET, TOKENIZER_DIR, Bundle, check_bundle_name, dir_bytes, staged_directory
from ssmport.contract import GraphSignature, check_contract, graph_names, read_signature
from ssmport.errors import SsmportError
from ssmport.interrupts import interrupts_deferred
from ssmport.manifest import (
    AssetEntry, FunctionEntry, Manifest, PrefillEntry, RecipeEntry, StateEntry, TokenizerEntry,
)  # fmt: skip
from ssmport.prefill import DEFAULT_CHUNK, PREFILL_FUNCTION, PREFILL_INPUT_NAMES, check_chunk, example_inputs
from ssmport.parity import MAX_GATE_TOKENS
from ssmport.progress import Stages
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder, summarize_plan
from ssmport.sources import load_model, source_paths
from ssmport.state import STATE_DTYPES, dtype_name

DEFAULT_STATE_DTYPE = "fp32"  # see docs/quantization.md for the drift measurement behind it
EXPORT_GATE_PROMPTS = 1
EXPORT_GATE_STEPS = 8


@dataclass
class ExportResult:
    path: Path
    manifest: Manifest
    gate_headline: str | None


def default_quant(model: LoadedModel) -> str:
    """int8keepproj for real weights (the phone-sized recipe); fp32 for synthetic demos,
    whose job is a fast, exact run on this machine's runtime."""
    return "fp32" if model.synthetic else "int8keepproj"


def export(
    spec: str | Path | LoadedModel,
    out: str | Path,
    *,
    quant: str | None = None,
    state_dtype: str | None = None,
    weights: str | Path | None = None,
    synthetic: bool = False,
    seed: int = 0,
    vocab: str | Path | None = None,
    file: str | None = None,
    name: str | None = None,
    overwrite: bool = False,
    gate: bool = True,
    gate_steps: int = EXPORT_GATE_STEPS,
    progress: bool = True,
    prefill_chunk: int | None = DEFAULT_CHUNK,
) -> ExportResult:
    """Export `spec` (preset, checkpoint path, Hub repo, or an already loaded model) as a
    bundle under directory `out`. `prefill_chunk` None: a decode-only bundle (no "prefill")."""
    started = time.perf_counter()
    state_dtype = state_dtype or DEFAULT_STATE_DTYPE
    if state_dtype not in STATE_DTYPES:
        raise SsmportError(f"unknown --state-dtype {state_dtype!r}; choose fp32 or fp16")
    if quant is not None:
        get_recipe(quant)  # fail on a bad name before any loading
    if gate and not 1 <= gate_steps <= MAX_GATE_TOKENS:
        raise SsmportError(f"--gate-steps must be at least 1 and at most {MAX_GATE_TOKENS:,} (or pass --no-gate)")
    check_chunk(prefill_chunk)
    with interrupts_deferred(), Stages(enabled=progress) as stages:  # see ssmport.interrupts
        with stages.stage("Reading checkpoint"):
            if isinstance(spec, LoadedModel):
                model = spec
            else:
                model = load_model(
                    str(spec), weights=weights, synthetic=synthetic, seed=seed, vocab=vocab, file=file, display=stages
                )
        recipe = get_recipe(quant or default_quant(model))
        final = Path(out) / check_bundle_name(name or f"{model.name}-{recipe.name}")
        with staged_directory(final, overwrite, protect=source_paths(model)) as tmp:
            manifest = _build_bundle(
                model, recipe.name, STATE_DTYPES[state_dtype], tmp, final.name, stages, prefill_chunk
            )
            bundle = Bundle(tmp, manifest)
            headline = None
            if gate:
                from ssmport.gate import gate_bundle  # imports the runtime only when needed

                report = gate_bundle(
                    bundle, model, prompts=EXPORT_GATE_PROMPTS, steps=gate_steps, stages=stages
                )
                headline = report.headline()
            manifest.export["seconds"] = round(time.perf_counter() - started, 2)
            manifest.export["peak_rss_mb"] = _peak_rss_mb()
            bundle.save_manifest()
    return ExportResult(final, manifest, headline)


def _build_bundle(
    model: LoadedModel,
    quant: str,
    state_dtype: torch.dtype,
    out: Path,
    name: str,
    stages: Stages,
    prefill_chunk: int | None,
) -> Manifest:
    arch, cfg = model.architecture, model.config
    recipe = get_recipe(quant)
    specs = arch.state_specs(cfg, state_dtype)
    builder = WeightBuilder(recipe, arch.keeps_float, on_store=stages.advance)

    converted = convert(model, builder, state_dtype, stages, prefill_chunk)
    signature = converted.decode

    with stages.stage("Writing asset"):
        converted.program.save_asset(out / ASSET)
        converted.program = None
        _return_freed_memory()
        tokenizer = _write_tokenizer(model, out)

    plan = builder.plan_json()
    manifest = Manifest(
        ssmport_version=__version__,
        bundle_id=uuid.uuid4().hex,
        name=name,
        architecture=arch.name,
        config=cfg.to_json(),
        source=model.provenance,
        synthetic_weights=model.synthetic,
        recipe=RecipeEntry(recipe.name, recipe.description, dtype_name(state_dtype)),
        main=_function_entry(signature),
        states=tuple(StateEntry(s.name, s.shape, s.dtype, spec.layout, spec.kind)
                     for s, spec in zip(signature.states, specs)),  # fmt: skip
        prefill=_prefill_entry(converted),
        plan={"summary": summarize_plan(plan), "tensors": plan},
        asset=AssetEntry(ASSET, dir_bytes(out / ASSET), files=_asset_file_hashes(out / ASSET)),
        tokenizer=tokenizer,
        notes=list(model.notes),
        export={"stage_seconds": {k: round(v, 2) for k, v in stages.times.items()}},
    )
    Bundle(out, manifest).save_manifest()
    return manifest


@dataclass
class Converted:
    """A converted program and the signatures read back from its IR (checked)."""

    program: Any
    decode: GraphSignature
    prefill: GraphSignature | None  # None: a decode-only program
    prefill_chunk: int | None


def convert(
    model: LoadedModel,
    builder: WeightBuilder,
    state_dtype: torch.dtype,
    stages: Stages | None = None,
    prefill_chunk: int | None = DEFAULT_CHUNK,
) -> Converted:
    """Build the decode module (and the prefill module, when the architecture has one and
    `prefill_chunk` is set) under `builder`'s recipe and convert them to one Core AI program:
    function "main" and function "prefill", sharing the weights.

    Both functions' signatures are read from the IR and checked against the contract.
    """
    stages = stages or Stages(enabled=False)
    arch, cfg = model.architecture, model.config
    specs = arch.state_specs(cfg, state_dtype)
    total = sum(math.prod(model.weights.shape(n)) for n in model.weights)
    with stages.stage("Building weights", total=total):
        with torch.no_grad():
            module = arch.build_decode(cfg, model.weights, builder, state_dtype).eval()
            prefill = arch.build_prefill(cfg, module, prefill_chunk) if prefill_chunk else None
    _check_buffers(module, specs)
    if prefill is not None:
        prefill.eval()
        _check_buffers(prefill, specs)
    _return_freed_memory()  # the fp32 temporaries of building; keeps the conversion peak low

    with stages.stage("torch.export"):
        example = (torch.zeros(1, 1, dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32))
        ep = _export_program(module, example)
        ep_prefill = None if prefill is None else _export_program(prefill, example_inputs(prefill_chunk))

    with stages.stage("Converting to Core AI"):
        from coreai_torch import TorchConverter

        state_names = [s.name for s in specs]
        with python_stdout_captured():
            converter = TorchConverter(mode=TorchConverter.Mode.RELEASE).add_exported_program(
                ep, input_names=list(INPUT_NAMES), output_names=list(OUTPUT_NAMES), state_names=state_names
            )
            if ep_prefill is not None:
                converter = converter.add_exported_program(
                    ep_prefill,
                    input_names=list(PREFILL_INPUT_NAMES),
                    output_names=list(OUTPUT_NAMES),
                    state_names=state_names,
                    entrypoint_name=PREFILL_FUNCTION,
                )
            program = converter.to_coreai()
        del ep, ep_prefill, module, prefill, converter
        _return_freed_memory()
        signature = read_signature(program)
        check_contract(signature, INPUT_NAMES, OUTPUT_NAMES, specs)
        prefill_sig = None
        if PREFILL_FUNCTION in graph_names(program):
            prefill_sig = read_signature(program, PREFILL_FUNCTION)
            check_contract(prefill_sig, PREFILL_INPUT_NAMES, OUTPUT_NAMES, specs)
    return Converted(program, signature, prefill_sig, prefill_chunk if prefill_sig else None)


def _export_program(module: torch.nn.Module, example: tuple[torch.Tensor, ...]):
    import coreai_torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch-internal pytree deprecations
        ep = torch.export.export(module, example)
        return ep.run_decompositions(coreai_torch.get_decomp_table())


def _function_entry(sig: GraphSignature) -> FunctionEntry:
    return FunctionEntry(sig.function, sig.inputs, sig.outputs)


def _prefill_entry(converted: Converted) -> PrefillEntry | None:
    """The prefill function's entry (same states as "main"), or None for decode-only bundles."""
    sig = converted.prefill
    if sig is None:
        return None
    main = _function_entry(sig)
    return PrefillEntry(main.function, main.inputs, main.outputs, converted.prefill_chunk)


def _check_buffers(module: torch.nn.Module, specs) -> None:
    got = [(n, tuple(b.shape), b.dtype) for n, b in module.named_buffers() if "." not in n]
    want = [(s.name, s.shape, s.dtype) for s in specs]
    if got != want:
        raise SsmportError(f"decode module states {got} differ from the declared {want}")


def _write_tokenizer(model: LoadedModel, out: Path) -> TokenizerEntry | None:
    """World vocabs are re-exported as a verified vocab.tsv; a tokenizer.json is copied as is."""
    if model.vocab_path is None:
        return None
    from ssmport.tokenizers import HF_JSON_KIND, HF_TOKENIZER_FILENAME, WORLD_KIND, tokenizer_kind

    (out / TOKENIZER_DIR).mkdir()
    if tokenizer_kind(model.vocab_path) == HF_JSON_KIND:
        from ssmport.tokenizers.hf_json import hf_json_vocab_size

        target = out / TOKENIZER_DIR / HF_TOKENIZER_FILENAME
        shutil.copyfile(model.vocab_path, target)
        kind, sha256, entries = HF_JSON_KIND, hashlib.sha256(target.read_bytes()).hexdigest(), hf_json_vocab_size(target)
    else:
        from ssmport.tokenizers import export_vocab_tsv

        target = out / TOKENIZER_DIR / "vocab.tsv"
        info = export_vocab_tsv(model.vocab_path, target)
        kind, sha256, entries = WORLD_KIND, info.sha256, info.entries
    return TokenizerEntry(kind, f"{TOKENIZER_DIR}/{target.name}", sha256, entries, model.vocab_origin)


def _asset_file_hashes(asset: Path) -> dict[str, str]:
    from ssmport.runtime.lowering import asset_file_hashes  # the runtime package loads coreai

    return asset_file_hashes(asset)


def _return_freed_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc keeps them otherwise)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def _peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
