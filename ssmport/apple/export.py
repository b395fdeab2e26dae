"""Exporting in the apple layout: the two functions (ssmport.apple.graph) with dynamic token and
position counts, and the files Apple's loader reads (metadata.json, tokenizer/tokenizer.json,
tokenizer/tokenizer_config.json) beside ssmport's own manifest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from ssmport.apple.graph import APPLE_MAINS, CHUNK_MAIN, DECODE_MAIN, INPUT_NAMES, MAIN, OUTPUT_NAMES, PREFILL, AppleLM
from ssmport.apple.metadata import WORLD_CHAT_TEMPLATE, metadata_json, tokenizer_config_json
from ssmport.apple.state_kinds import FIXED, KV_CACHE, SLIDING_CACHE
from ssmport.errors import SsmportError
from ssmport.state import KV, RING

# Apple's engines feed at most min(512, COREAI_CHUNK_THRESHOLD) tokens per call
# (ModelConfig.swift:131-143@86b363d); an architecture may allow fewer (max_prefill_chunk).
MAX_ROWS = 512
MAX_POSITIONS = 1 << 17  # the longest history `position_ids` may carry into a recurrent model
TRACE_POSITIONS = 16  # a growing KV cache's positions in the tracing example (more than its P)
APPLE_KINDS = {KV: KV_CACHE, RING: SLIDING_CACHE}  # ssmport's state kinds as Apple's (others: fixed)


def max_rows(arch, specs) -> int:
    """The most tokens one call may carry: Apple's bound, the architecture's, and a KV cache's
    context (`specs`: the native states)."""
    context = min((s.context for s in specs if s.context is not None), default=MAX_ROWS)
    return min(MAX_ROWS, arch.max_prefill_chunk or MAX_ROWS, context)


def apple_modules(arch, config, decode, with_prefill: bool, main_form: str = DECODE_MAIN) -> tuple[AppleLM, AppleLM | None]:
    """`main` (in `main_form`, see ssmport.apple.graph) and (optionally) `prefill` of the apple
    layout over the decode module's blocks."""
    splits = arch.apple_state_splits(config)
    if splits is None:
        # Architecture.apple_state_splits: None until the family's chunked prefill can take a
        # dynamic token count without a loop (Apple's prefill does; mamba1's scan unrolls per block)
        raise SsmportError(f"--layout apple: {arch.name} has no apple layout: Apple's prefill takes a dynamic token "
                           f"count, which {arch.name}'s chunked prefill form cannot; use the default layout")  # fmt: skip
    context = min((s.context for s in decode.specs if s.context is not None), default=None)
    if context is not None and context < TRACE_POSITIONS:  # torch.export traces a KV cache at 16 positions
        raise SsmportError(f"--context {context}: the apple layout needs a KV cache of at least {TRACE_POSITIONS} "
                           "positions (it is traced with that many); give a larger --context")  # fmt: skip
    rows = max_rows(arch, decode.specs)
    main = AppleLM(decode, splits, True, rows, one_token=main_form == DECODE_MAIN).eval()
    return main, (AppleLM(decode, splits, False, rows).eval() if with_prefill else None)


def verify_module(arch, config, decode, k: int) -> AppleLM:
    """The verify function of the apple layout (ssmport.verify): `main`'s chunk form, logits of
    every row, up to k rows a call (Apple's engines never call it; ssmport's runner does)."""
    rows = min(k, max_rows(arch, decode.specs))
    return AppleLM(decode, arch.apple_state_splits(config), True, rows).eval()


def example_and_shapes(module: AppleLM) -> tuple[tuple, tuple]:
    """Tracing inputs and torch.export's dynamic shapes: P dynamic, and T unless the module takes
    one token (traced at T=5, P=9: sizes 0 and 1 would be specialised); the states, a growing
    KV cache's positions S dynamic up to its context (traced at 16), P then bounded by S."""
    context = min((s.max_context for s in module.specs if s.dynamic), default=None)
    P = torch.export.Dim("P", min=1, max=context or MAX_POSITIONS)
    S = torch.export.Dim("S", min=2, max=context) if context else None
    positions = torch.zeros(1, 9, dtype=torch.int32)
    states = module.example_states(TRACE_POSITIONS)
    state_shapes = tuple({3: S} if s.dynamic else None for s in module.specs)
    if module.one_token:
        return (torch.zeros(1, 1, dtype=torch.int32), positions, states), (None, {1: P}, state_shapes)
    T = torch.export.Dim("T", min=1, max=module.max_rows)
    rows = min(5, module.max_rows)  # a verify function may take fewer than 5
    return (torch.zeros(1, rows, dtype=torch.int32), positions, states), ({1: T}, {1: P}, state_shapes)


def write_files(out: Path, manifest, model) -> None:
    """metadata.json and the tokenizer files Apple's loader needs, from the finished manifest."""
    from ssmport.tokenizers import HF_JSON_KIND, load_tokenizer

    tok = manifest.tokenizer
    config = None
    if tok is not None and tok.kind == HF_JSON_KIND:
        # a tokenizer.json is in the bundle already; its tokenizer_config.json too, when the
        # checkpoint had one next to it
        source_config = Path(model.vocab_path).with_name("tokenizer_config.json")
        if source_config.is_file():
            shutil.copyfile(source_config, out / "tokenizer" / "tokenizer_config.json")
        else:
            eos = load_tokenizer(out / tok.path)
            eos_token = eos._tok.id_to_token(eos.eos_ids[0]) if eos.eos_ids else ""
            config = tokenizer_config_json(eos_token=eos_token, chat_template="")
    elif tok is not None:
        from ssmport.tokenizers.world_json import END_OF_TEXT, END_OF_TEXT_ID, world_tokenizer_json

        world = load_tokenizer(out / tok.path)
        (out / "tokenizer" / "tokenizer.json").write_text(world_tokenizer_json(world, manifest.vocab_size), "utf-8")
        config = tokenizer_config_json(eos_token=END_OF_TEXT, chat_template=WORLD_CHAT_TEMPLATE,
                                       added_tokens={END_OF_TEXT_ID: END_OF_TEXT})  # fmt: skip
    if config is not None:
        (out / "tokenizer" / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", "utf-8")
    kv = [s for s in manifest.states if s.kind == KV]
    metadata = metadata_json(
        name=manifest.name,
        vocab_size=manifest.vocab_size,
        max_context_length=min(s.context for s in kv) if kv else MAX_POSITIONS,
        tokenizer=(model.provenance.get("hub") or {}).get("repo") or manifest.name,
        asset=manifest.asset.path,
        compression=manifest.recipe.name,
        states={s.name: APPLE_KINDS.get(s.kind, FIXED) for s in manifest.states},
    )
    (out / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n", "utf-8")


__all__ = ["APPLE_MAINS", "CHUNK_MAIN", "DECODE_MAIN", "INPUT_NAMES", "MAIN", "MAX_POSITIONS", "MAX_ROWS", "OUTPUT_NAMES", "PREFILL", "apple_modules",
           "example_and_shapes", "max_rows", "write_files"]  # fmt: skip
