"""ssmport tokenizer export VOCAB -o vocab.tsv: the device vocab, verified byte-exact."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("tokenizer", help="tokenizer tools (export the device vocab)")
    tsub = p.add_subparsers(dest="tokenizer_command", metavar="ACTION", required=True)
    e = tsub.add_parser(
        "export",
        help="write id<TAB>base64(bytes) per line and verify it",
        description="Write VOCAB as `id\\tbase64(token bytes)` lines sorted by id (LF), then "
        "re-read it and verify every entry and the encoding of a test corpus.",
    )
    e.add_argument("vocab", help="rwkv_vocab_v20230424.txt (or a vocab.tsv)")
    e.add_argument("-o", "--out", required=True, help="output vocab.tsv")
    e.set_defaults(func=run_export)


def run_export(args) -> int:
    from ssmport.tokenizers import export_vocab_tsv

    info = export_vocab_tsv(args.vocab, args.out)
    print(f"{args.out}: {info.entries} entries, sha256 {info.sha256} (verified)")
    return 0
