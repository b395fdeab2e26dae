"""ssmport export MODEL: checkpoint or preset -> Core AI decode bundle."""

from __future__ import annotations

import argparse
import math
import sys

from ssmport.cli.common import MAX_SEED, check_int, human_bytes
from ssmport.manifest import LAYOUTS as LAYOUT_NAMES  # light: the parser is built on every command
from ssmport.prefill import DEFAULT_CHUNK
from ssmport.quant import RECIPES


def add_parser(sub) -> None:
    p = sub.add_parser(
        "export",
        help="export a checkpoint or preset to a Core AI decode bundle",
        description="Export MODEL (a preset name, a BlinkDL .pth, a Hugging Face / fla folder, or a "
        "Hugging Face Hub repo org/name) to OUT/<name>-<quant>/ with model.aimodel + manifest.json, "
        "then gate it on the Core AI runtime. A preset or repo is downloaded into the Hugging Face "
        "cache (HF_HOME / HF_HUB_CACHE; HF_HUB_OFFLINE=1 uses only the cache, HF_TOKEN for gated "
        "repos); append @REVISION (branch, tag or commit sha) to pin one. Written atomically: a "
        "failed export leaves nothing behind. Exit status 1 if the bundle was written but failed its gate.",
    )
    p.add_argument("model", help="preset (see `ssmport list`), .pth file, HF folder, or Hub repo org/name[@revision]")
    p.add_argument("-o", "--out", default="out", help="parent directory of the bundle (default: out)")
    p.add_argument("--quant", choices=list(RECIPES), help="recipe (default: int8keepproj for real "
                   "weights, fp32 for synthetic); see `ssmport list --recipes`")  # fmt: skip
    p.add_argument("--size-budget", metavar="SIZE", help="with --quant auto: the most the asset may weigh (e.g. "
                   "3.5MB, 2.2GB; 1 MB = 1024 KB); each matmul's precision is chosen by measured error to fit")
    p.add_argument("--int8-tied-table", action=argparse.BooleanOptionalAction, default=None,
                   help="a tied embedding read from the int8 LM head's levels, stored once (default: on for "
                   "int4keepproj, off for int8keepproj and int8, where it measured a larger share of their "
                   "error; auto offers it where its measurement chooses it, --no-int8-tied-table: not; "
                   "docs/quantization.md)")  # fmt: skip
    p.add_argument("--state-dtype", choices=["fp32", "fp16"], help="storage dtype of the recurrent "
                   "states (default fp32; the recurrence always computes in fp32)")  # fmt: skip
    p.add_argument("--weights", help="local checkpoint for a preset name (.pth or HF folder) instead of its download")
    p.add_argument("--file", help="the .pth checkpoint to take from a Hub repo that holds several")
    p.add_argument("--synthetic", action="store_true", help="deterministic random weights for a preset")
    p.add_argument("--seed", type=int, default=0, help="seed of --synthetic weights (default 0)")
    p.add_argument("--vocab", help="tokenizer (rwkv_vocab_*.txt, vocab.tsv or tokenizer.json); default: one "
                   "next to the checkpoint, else the bundled World vocab for 65,536-token RWKV models")  # fmt: skip
    p.add_argument("--name", help="bundle directory name (default: <model>-<quant>)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing bundle (only an ssmport bundle: "
                   "anything else at the target is refused)")  # fmt: skip
    p.add_argument("--no-gate", action="store_true", help="skip the short parity gate (and, for a model that "
                   "ships with ssmport, the score on its held-out text)")  # fmt: skip
    p.add_argument("--gate-steps", type=int, default=8, help="tokens in the export gate (default 8)")
    p.add_argument("--gate-prefill", action=argparse.BooleanOptionalAction, default=None,
                   help="also feed the export gate's prompt through the prefill function (default: fp32 bundles "
                        "only; a 16-bit bundle's padded chunk costs this runtime as much as 64 decode calls, over "
                        "20 minutes at 1.5B)")  # fmt: skip
    p.add_argument("--prefill-chunk", type=int, default=DEFAULT_CHUNK, metavar="T",
                   help=f"tokens per call of the bundle's chunked `prefill` function (default {DEFAULT_CHUNK})")
    p.add_argument("--context", type=int, metavar="N",
                   help="positions the KV cache holds, for models with attention layers (Qwen3.5; default "
                        "4096): feeding past them is refused, and KV memory grows with N (`ssmport inspect`)")
    p.add_argument("--no-prefill", action="store_true",
                   help="export the decode function `main` only (prompts then run one token at a time)")
    p.add_argument("--verify", type=int, metavar="K",
                   help="add a `verify` function checking K drafted tokens per call, for speculative "
                   "decoding (`generate --draft`, `chat --draft`; docs/speculative.md); default: none")
    p.add_argument("--layout", choices=LAYOUT_NAMES, default="ssmport",
                   help="ssmport (default): main [1,1] + padded prefill chunks; apple: the functions, "
                   "states and files Apple's CoreAILanguageModels engines load and drive "
                   "(docs/apple-engines.md; check with `ssmport check-engine`)")  # fmt: skip
    p.add_argument("--apple-main", choices=["decode", "chunk"], default=None,
                   help="with --layout apple: decode (default): `main` takes one token per call, the M=1 "
                   "decode graph, for Apple's engines since the prefill function (#204/#227); chunk: "
                   "`main` takes [1, T] through the chunk path, which the 86b363d engines need (they "
                   "send whole prompts to `main`) at the cost of a heavier decode step")  # fmt: skip
    p.add_argument("--experts", choices=["gathered", "branched"], default="gathered",  # moe.EXPERT_FORMS
                   help="MoE models: how decode and prefill read the routed experts. gathered (default): "
                   "each token's chosen experts' weights copied by index, then one batched matmul; branched: "
                   "an `if` per expert reading its weights in place over the call's tokens, 2.7x faster per "
                   "decode layer on the Linux runtime but E host-decided branches a layer on a device "
                   "(benchmarks/moe_inplace.py)")  # fmt: skip
    p.add_argument("--profile-memory", action="store_true",
                   help="trace the peak RSS of every stage (loading, building, torch.export, conversion, "
                   "writing, lowering, the gate); printed after the export and recorded in the manifest")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    p.set_defaults(func=run)


def run(args) -> int:
    from ssmport.exporter.options import ExportOptions
    from ssmport.exporter.pipeline import export

    check_int(args.seed, "--seed", 0, MAX_SEED)
    # Checked when made, before the checkpoint is read (a Hub download can take minutes).
    options = ExportOptions(
        quant=args.quant,
        state_dtype=args.state_dtype,
        weights=args.weights,
        synthetic=args.synthetic,
        seed=args.seed,
        vocab=args.vocab,
        file=args.file,
        name=args.name,
        overwrite=args.overwrite,
        gate=not args.no_gate,
        gate_steps=args.gate_steps,
        gate_prefill=args.gate_prefill,
        progress=not args.quiet,
        prefill_chunk=None if args.no_prefill else args.prefill_chunk,
        layout=args.layout,
        apple_main=args.apple_main,
        context=args.context,
        profile_memory=args.profile_memory,
        size_budget=args.size_budget,
        verify=args.verify,
        experts=args.experts,
        int8_tied_table=args.int8_tied_table,
    )
    result = export(args.model, args.out, options)
    m = result.manifest
    for note in m.notes:
        print(f"ssmport: note: {note}", file=sys.stderr)
    synthetic = " [synthetic weights]" if m.synthetic_weights else ""
    print(f"bundle: {result.path}{synthetic}")
    print(f"asset: {human_bytes(m.asset.bytes)} ({m.recipe.name}, state {m.recipe.state_dtype}), "
          f"export {result.timings['seconds']:.1f} s, peak RSS {result.timings['peak_rss_mb']:.0f} MB")  # fmt: skip
    if result.memory is not None:
        print("\n".join(result.memory.lines()))
    if result.gate_headline:
        print(f"gate: {result.gate_headline}", flush=True)
        if m.gate.functions_not_run:
            print(f"gate: the decode function only; `ssmport gate {result.path}` (or export --gate-prefill) "
                  "also checks prefill", flush=True)  # fmt: skip
        if not m.gate.passed:
            print(f"ssmport: the bundle was written but failed its gate; see {result.path / 'gate.json'} "
                  "and `ssmport gate` for the full report", file=sys.stderr)  # fmt: skip
            return 1
        return _print_validation(result.path)
    return 0


def _print_validation(path) -> int:
    """A shipped model's bundle: its loss on held-out text, next to the fp32 reference's.
    Exit status 1 where it is not a finite number."""
    from ssmport.gate.checks import score_bundle

    scored = score_bundle(path)
    if scored is None:
        return 0
    model, loss, n = scored
    print(f"validation: {loss:.4f} nats/byte on {n} held-out bytes (this bundle, Core AI runtime; "
          f"fp32 reference {model.reference_loss:.4f}; whole held-out split {model.split_loss:.4f})")  # fmt: skip
    if not math.isfinite(loss):
        print("ssmport: the bundle's validation loss is not a number", file=sys.stderr)
        return 1
    return 0
