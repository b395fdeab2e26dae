"""Entry point: parse, dispatch, and turn user errors into one line and a non-zero exit."""

from __future__ import annotations

import argparse
import importlib
import sys

from ssmport import __version__
from ssmport.errors import SsmportError

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130
COMMANDS = ("export", "gate", "logits", "generate", "chat", "inspect", "check-engine", "list", "bench", "tokenize",
            "tokenizer")  # fmt: skip


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit status 2) like every other."""

    def error(self, message: str):
        self.exit(EXIT_USER_ERROR, f"ssmport: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ssmport",
        description="Port recurrent / linear-attention LMs (RWKV-7, ...) to Core AI decode bundles: "
        "no KV cache, O(1) state, parity-gated against torch.",
        epilog="Start with: ssmport export rwkv7-pydoc --quant fp32 -o out/  (embedded default, no download)",
    )
    parser.add_argument("--version", action="version", version=f"ssmport {__version__}")
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="FILE_OR_MODULE",
        help="import an architecture defined outside ssmport (a .py file or a module name) "
        "before running the command; repeatable; also read from $SSMPORT_PLUGINS",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # Imported here, not at module level, so a Ctrl-C while torch loads is handled by main().
    for name in COMMANDS:
        importlib.import_module(f"ssmport.cli.{name.replace('-', '_')}_cmd").add_parser(sub)
    return parser


def user_errors() -> tuple[type[BaseException], ...]:
    from ssmport.tokenizers import TokenizerError, VocabError

    return (SsmportError, TokenizerError, VocabError)


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        from ssmport.plugins import load_plugins

        load_plugins(args.plugin)
        code = args.func(args) or 0
    except user_errors() as exc:
        print(f"ssmport: error: {exc}", file=sys.stderr)
        code = EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("ssmport: interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    except BrokenPipeError:  # `ssmport ... | head`
        code = 0
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
