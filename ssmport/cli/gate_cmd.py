"""ssmport gate BUNDLE: teacher-forced parity report against the fp32 torch reference."""

from __future__ import annotations

import json

from ssmport.cli.common import check_ids, check_int, human_bytes, read_text_file, read_token_file
from ssmport.errors import SsmportError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "gate",
        help="teacher-forced parity report (exit 1 if it fails)",
        description="Feed the same token streams, one token at a time from zeroed state, to the "
        "fp32 torch reference and to the bundle on the Core AI runtime; compare per-step top-1 "
        "and max |Δlogits| under the recipe's documented thresholds. A bundle with a prefill "
        "function takes the first half of each stream through it as one prompt (one record), then "
        "the rest token by token. Writes gate.json into the bundle. Exit status 1 if the gate fails.",
    )
    p.add_argument("bundle")
    p.add_argument("--weights", help="source checkpoint, if it moved since export")
    p.add_argument("--prompts", type=int, default=3, help="number of token streams (default 3)")
    p.add_argument("--steps", type=int, default=32, help="tokens per stream (default 32)")
    p.add_argument("--tokens-file", help="one stream of token ids (commas/whitespace)")
    p.add_argument("--text", action="append", help="a text stream (needs the bundle's tokenizer); repeatable")
    p.add_argument("--text-file", action="append", help="a file whose text is one stream; repeatable")
    p.add_argument("--compare", action="store_true",
                   help="also export the model under every recipe and show the gates side by side")  # fmt: skip
    p.add_argument("--decode-only", action="store_true",
                   help="every token through the decode function `main`, none through `prefill` (whose "
                        "padded chunk costs this runtime tens of minutes at released sizes); printed, not "
                        "recorded in the bundle")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from ssmport.bundle import GATE, MANIFEST, Bundle
    from ssmport.files import check_output
    from ssmport.gate.run import bundle_tokenizer, gate_bundle
    from ssmport.gate.report import MAX_GATE_TOKENS
    from ssmport.quant import RECIPES

    check_int(args.prompts, "--prompts", 1, MAX_GATE_TOKENS)
    check_int(args.steps, "--steps", 1, MAX_GATE_TOKENS)
    if args.prompts * args.steps > MAX_GATE_TOKENS:
        raise SsmportError(f"--prompts x --steps is {args.prompts * args.steps:,} teacher-forced steps; "
                           f"the limit is {MAX_GATE_TOKENS:,}")  # fmt: skip
    bundle = Bundle.open(args.bundle)
    if bundle.manifest.recipe.name not in RECIPES:
        raise SsmportError(f"{bundle.path}: the manifest names recipe {bundle.manifest.recipe.name!r}, which this "
                           f"ssmport does not know ({', '.join(RECIPES)}); re-export the bundle")  # fmt: skip
    if args.compare and args.decode_only:
        raise SsmportError("--decode-only applies to the bundle's own gate, not to --compare")
    if not args.compare and not args.decode_only:  # the gate records its transcript in the bundle: check that it can, first
        check_output(bundle.path / GATE, "the gate transcript", streams=False, follow_links=False)
        check_output(bundle.path / MANIFEST, "the bundle manifest", streams=False, follow_links=False)
    vocab = bundle.manifest.vocab_size
    streams = []
    if args.tokens_file:
        streams.append(check_ids(read_token_file(args.tokens_file), vocab, args.tokens_file))
    texts = list(args.text or [])
    texts += [read_text_file(f) for f in args.text_file or []]
    if sum(map(len, streams)) + sum(map(len, texts)) > MAX_GATE_TOKENS * 16:  # 16 bytes a token at most
        raise SsmportError(f"the given streams are too long for one gate (the limit is {MAX_GATE_TOKENS:,} tokens)")
    if texts:
        tokenizer = bundle_tokenizer(bundle)
        if tokenizer is None:
            raise SsmportError(f"{bundle.path}: has no tokenizer, so --text cannot be used; pass --tokens-file")
        streams += [check_ids(tokenizer.encode(t), vocab, "--text") for t in texts]
    if sum(map(len, streams)) > MAX_GATE_TOKENS:
        raise SsmportError(f"the given streams hold {sum(map(len, streams)):,} tokens; the limit is {MAX_GATE_TOKENS:,}")
    if args.compare:
        return _compare(bundle, streams, args)
    from ssmport.progress import Stages

    with Stages() as stages:  # bars on a terminal; in a log, a line per long stage (minutes at released sizes)
        report = gate_bundle(bundle, prompts=args.prompts, steps=args.steps, token_streams=streams or None,
                             weights=args.weights, stages=stages, record=not args.decode_only,
                             prefill=not args.decode_only)  # fmt: skip
    if args.json:
        print(json.dumps(report.summary(), indent=2))
    else:
        print(report.headline())
        w = report.worst
        judge = "fp64 " if report.has_floor else ""
        if w is not None:
            print(f"worst step: stream {w.prompt} step {w.step} (token {w.token}), |Δ| vs {judge or 'the '}reference "
                  f"{report.judged_delta(w):.3g}")  # fmt: skip
        for s in report.steps:
            if s.status != "agree":
                top, margin = (s.exact_top1, s.exact_margin) if report.has_floor else (s.ref_top1, s.ref_margin)
                print(f"  {s.status}: stream {s.prompt} step {s.step} {judge}ref top-1 {top} "
                      f"(margin {margin:.3g}) vs {s.got_top1}")  # fmt: skip
        if args.decode_only:
            print("decode only: not recorded in the bundle")
        else:
            print(f"transcript: {bundle.path / 'gate.json'}")
    return 0 if report.passed else 1


def _compare(bundle, streams, args) -> int:
    from ssmport.gate.compare import compare_recipes
    from ssmport.gate.run import bundle_tokenizer
    from ssmport.gate.report import default_prompts

    vocab = bundle.manifest.vocab_size
    streams = streams or default_prompts(vocab, args.prompts, args.steps, tokenizer=bundle_tokenizer(bundle))
    rows = compare_recipes(bundle, streams, args.weights)
    synthetic = " [synthetic weights]" if bundle.manifest.synthetic_weights else ""
    print(f"{len(streams)} stream(s), {sum(map(len, streams))} teacher-forced steps vs the fp32 torch reference{synthetic}")
    print(f"{'recipe':14} {'asset':>10} {'top-1':>9} {'ties':>5} {'miss':>5} {'max|Δ|':>9} {'rel':>9} {'limit':>7}  verdict")
    for name, nbytes, r in rows:
        s = r.summary()
        print(f"{name:14} {human_bytes(nbytes):>10} {s['top1_agree']:>4}/{r.n:<4} {s['top1_excused_ties']:>5} "
              f"{s['top1_mismatch']:>5} {s['max_abs_logit_delta']:>9.3g} {s['max_rel_logit_delta']:>9.2e} "
              f"{r.limit:>7.2g}  {'PASS' if r.passed else 'FAIL'}")  # fmt: skip
    own = next(r for name, _, r in rows if name == bundle.manifest.recipe.name)
    return 0 if own.passed else 1
