"""Small helpers shared by subcommands: token ids, text files, and option ranges."""

from __future__ import annotations

import math
import re

from ssmport.errors import SsmportError

MAX_SEED = 2**32 - 1  # numpy and torch both take any seed in [0, 2**32)
MAX_GENERATE = 10**9  # tokens one generate or chat reply may ask for
MAX_TEXT_FILE = 256 << 20  # a prompt, script or token file larger than this is not one


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


def read_text_file(path: str) -> str:
    """A user's text file as UTF-8; unreadable, too big or not UTF-8 is one line."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TEXT_FILE + 1)
    except OSError as exc:
        raise SsmportError(f"{path}: cannot read ({exc.strerror})") from None
    if len(data) > MAX_TEXT_FILE:
        raise SsmportError(f"{path}: larger than {MAX_TEXT_FILE >> 20} MB; not a text input ssmport reads")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SsmportError(f"{path}: not valid UTF-8 text (byte {exc.start})") from None


def read_token_file(path: str) -> list[int]:
    return parse_token_ids(read_text_file(path), path)


def check_int(value: int, option: str, lo: int, hi: int) -> int:
    """An integer option within [lo, hi], or one line saying which bound it breaks."""
    if value < lo:
        raise SsmportError(f"{option} must be at least {lo} (got {value})")
    if value > hi:
        raise SsmportError(f"{option} must be at most {hi:,} (got {value:,})")
    return value


def check_float(value: float, option: str, lo: float, hi: float = math.inf, *, above: bool = False) -> float:
    """A finite float option in [lo, hi] (`above`: strictly greater than lo)."""
    if not math.isfinite(value):
        raise SsmportError(f"{option} must be a finite number (got {value})")
    if value < lo or (above and value == lo):
        raise SsmportError(f"{option} must be {'greater than' if above else 'at least'} {lo:g} (got {value:g})")
    if value > hi:
        raise SsmportError(f"{option} must be at most {hi:g} (got {value:g})")
    return value


def check_sampling(args) -> None:
    """--temperature, --top-p and --seed of generate and chat."""
    check_float(args.temperature, "--temperature", 0.0)
    check_float(args.top_p, "--top-p", 0.0, 1.0, above=True)
    check_int(args.seed, "--seed", 0, MAX_SEED)


def check_ids(ids: list[int], vocab_size: int, origin: str) -> list[int]:
    if not ids:
        raise SsmportError(f"{origin}: no token ids given")
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise SsmportError(f"{origin}: token id(s) {bad[:5]} outside the vocabulary [0, {vocab_size})")
    return ids
