"""ssmport generate BUNDLE: decode on the Core AI runtime, from ids or text."""

from __future__ import annotations

import json
import sys

from ssmport.cli.common import MAX_GENERATE, check_ids, check_int, check_sampling, parse_token_ids
from ssmport.errors import SsmportError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="generate tokens or text with the bundle on the Core AI runtime",
        description="Feed a prompt and generate with the no-KV runner. --tokens prints ids; "
        "--prompt encodes with the bundle's tokenizer and streams decoded text.",
    )
    p.add_argument("bundle")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokens", help="prompt token ids, e.g. 1,2,3")
    src.add_argument("--prompt", help="prompt text (needs the bundle's tokenizer)")
    p.add_argument("-n", "--max-tokens", type=int, default=32, help="tokens to generate (default 32)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1.0)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--draft", metavar="lookup|mtp|BUNDLE",
                   help="speculative decoding (needs a bundle exported with --verify K): drafts from prompt "
                   "lookup, from the bundle's own multi-token-prediction head (mtp: a Qwen3.5 checkpoint's "
                   "mtp.*), or from a smaller BUNDLE with the same tokenizer; the ids are those of plain "
                   "decoding at temperature 0, and follow its distribution when sampling (docs/speculative.md)")
    p.add_argument("--draft-tokens", type=int, metavar="K",
                   help="with --draft: tokens one verify call checks (default: the bundle's --verify K)")
    p.add_argument("--json", action="store_true", help="print one JSON object: the ids, the target's calls "
                   "during generation and, with --draft, the accepted-draft statistics")  # fmt: skip
    p.set_defaults(func=run)


def run(args) -> int:
    from ssmport.bundle import Bundle
    from ssmport.gate.run import bundle_tokenizer
    from ssmport.runtime import Runner
    from ssmport.runtime.speculative import speculative_decoder

    check_int(args.max_tokens, "--max-tokens", 0, MAX_GENERATE)
    check_sampling(args)
    if args.draft_tokens is not None and args.draft is None:
        raise SsmportError("--draft-tokens applies with --draft only")
    bundle = Bundle.open(args.bundle)
    vocab = bundle.manifest.vocab_size
    tokenizer = None
    if args.prompt is not None:
        tokenizer = bundle_tokenizer(bundle)
        if tokenizer is None:
            raise SsmportError(f"{bundle.path}: has no tokenizer; use --tokens with ids")
        prompt = check_ids(tokenizer.encode(args.prompt), vocab, "--prompt")
    else:
        prompt = check_ids(parse_token_ids(args.tokens, "--tokens"), vocab, "--tokens")
    if bundle.manifest.synthetic_weights:
        print("[synthetic weights: output is noise by design]", file=sys.stderr)
    with Runner(bundle) as runner, speculative_decoder(runner, args.draft, args.draft_tokens) as decoder:
        ends = set(tokenizer.eos_ids) if tokenizer else None
        source = decoder if args.draft or args.json else runner  # --json counts plain decoding's calls too
        ids = source.generate(prompt, args.max_tokens, args.temperature, args.top_p, args.seed, stop=ends)
        if args.json:
            out = list(ids)
            print(json.dumps({"ids": out, "prompt_tokens": len(prompt), "draft": args.draft} | decoder.stats.to_json()))
        elif tokenizer is None:
            for n, token in enumerate(ids):
                print(("," if n else "") + str(token), end="", flush=True)
            print()
        else:
            stream = tokenizer.stream()
            sys.stdout.write(args.prompt)
            for token in ids:
                if token in ends or tokenizer.token_bytes(token) is None:
                    break  # end of text, or an id with no text
                sys.stdout.write(stream.feed(token))
                sys.stdout.flush()
            sys.stdout.write(stream.flush() + "\n")
    return 0
