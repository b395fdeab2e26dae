"""Small helpers shared by subcommands."""

from __future__ import annotations

import re
from pathlib import Path

from ssmport.errors import SsmportError


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def parse_token_ids(text: str, origin: str) -> list[int]:
    """Integers separated by commas and/or whitespace."""
    pieces = [p for p in re.split(r"[\s,]+", text.strip()) if p]
    ids = []
    for piece in pieces:
        try:
            ids.append(int(piece))
        except ValueError:
            raise SsmportError(f"{origin}: {piece!r} is not an integer token id") from None
    return ids


def read_token_file(path: str) -> list[int]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SsmportError(f"{path}: cannot read ({exc.strerror})") from None
    return parse_token_ids(text, path)


def check_ids(ids: list[int], vocab_size: int, origin: str) -> list[int]:
    if not ids:
        raise SsmportError(f"{origin}: no token ids given")
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise SsmportError(f"{origin}: token id(s) {bad[:5]} outside the vocabulary [0, {vocab_size})")
    return ids
