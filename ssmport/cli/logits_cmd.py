"""ssmport logits BUNDLE: per-step logits for a token stream, as float32 [T, V] .npy.

Stable contract (external checks use it): ids from --tokens-file (commas and/or whitespace),
fed one at a time from zeroed state; row t is the logits after token t.
"""

from __future__ import annotations

import numpy as np

from ssmport.cli.common import check_ids, read_token_file
from ssmport.files import check_output, write_output


def add_parser(sub) -> None:
    p = sub.add_parser(
        "logits",
        help="write per-step logits of a token stream to .npy",
        description="Feed the ids in --tokens-file one at a time from zeroed state through the "
        "bundle's decode function (or the fp32 torch reference with --backend torch) and save "
        "float32 [T, V] with np.save; row t is the logits after token t.",
    )
    p.add_argument("bundle")
    p.add_argument("--tokens-file", required=True, help="integer ids separated by commas and/or whitespace")
    p.add_argument("--out", required=True, help="output .npy path")
    p.add_argument("--backend", choices=["coreai", "torch"], default="coreai")
    p.add_argument("--weights", help="source checkpoint for --backend torch, if it moved since export")
    p.set_defaults(func=run)


def run(args) -> int:
    from ssmport.bundle import Bundle

    bundle = Bundle.open(args.bundle)
    vocab = bundle.manifest.vocab_size
    ids = check_ids(read_token_file(args.tokens_file), vocab, args.tokens_file)
    check_output(args.out, "--out")
    if args.backend == "torch":
        from ssmport.loader.resolve import rebuild_bundle_source
        from ssmport.gate.torch_runner import TorchRunner

        runner = TorchRunner(rebuild_bundle_source(bundle.manifest, args.weights), "fp32")
    else:
        from ssmport.runtime import Runner

        runner = Runner(bundle)
    try:
        logits = runner.step_each(ids).astype(np.float32)
    finally:
        runner.close()
    write_output(args.out, lambda f: np.save(f, logits), what="--out")
    print(f"{args.out}: float32 {list(logits.shape)} ({args.backend})")
    return 0
