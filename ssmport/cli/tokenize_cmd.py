"""ssmport tokenize VOCAB_OR_BUNDLE --text ...: print token ids."""

from __future__ import annotations

import json
from pathlib import Path

from ssmport.errors import SsmportError


def add_parser(sub) -> None:
    p = sub.add_parser("tokenize", help="encode text with a World vocab, a tokenizer.json or a bundle's tokenizer")
    p.add_argument("source", help="rwkv_vocab_v20230424.txt, vocab.tsv, tokenizer.json, or a bundle")
    p.add_argument("--text", required=True)
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(func=run)


def load_tokenizer(source: str):
    from ssmport.tokenizers import load_tokenizer as load_file

    path = Path(source)
    if path.is_dir():
        from ssmport.bundle import Bundle

        bundle = Bundle.open(path)
        if bundle.vocab_path is None:
            raise SsmportError(f"{path}: bundle has no tokenizer")
        path = bundle.vocab_path
    if not path.is_file():
        raise SsmportError(f"{source}: no such vocab file or bundle")
    return load_file(path)


def run(args) -> int:
    from ssmport.tokenizers import TokenizerError

    tokenizer = load_tokenizer(args.source)
    try:
        ids = tokenizer.encode(args.text)
    except TokenizerError as exc:
        raise SsmportError(f"--text: {exc}") from None
    print(json.dumps(ids) if args.json else " ".join(map(str, ids)))
    return 0
