"""Reading and writing RWKV World vocab files.

Two on-disk formats map token ids to byte strings:

* ``txt`` -- the original ``rwkv_vocab_v20230424.txt``: one entry per line,
  ``<id> <python str or bytes literal> <byte length>``, e.g. ``33 ' ' 1`` or
  ``129 b'\\x80' 1``.  A ``str`` literal stands for its UTF-8 encoding.
* ``tsv`` -- ssmport's canonical export, ``vocab.tsv``: ``<id>\\t<base64>``
  per line, ids strictly ascending, LF line endings, no header.  The exact
  bytes of this file are a pure function of the id -> bytes table, so its
  sha256 doubles as the tokenizer fingerprint.

Every problem is reported as :class:`VocabError` with a one-line message
``<file>:<line>: <what is wrong>`` that a CLI can print as is.
"""

from __future__ import annotations

import ast
import base64
import binascii
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from ssmport.errors import SsmportError

VocabFormat = Literal["txt", "tsv"]

#: The World vocab shipped inside the package (see data/README.md for why and its license).
BUNDLED_WORLD_VOCAB = Path(__file__).parent / "data" / "rwkv_vocab_v20230424.txt"

#: Names a vocab file is looked up under next to a model, in order of preference.
VOCAB_FILENAMES: tuple[str, ...] = ("rwkv_vocab_v20230424.txt", "vocab.tsv")

# Token ids end up in int32 tensors; anything larger is certainly a broken file.
MAX_TOKEN_ID = 2**31 - 1

# `<id> <literal> <len>`: the literal may itself contain spaces, so (like the
# reference parser) the id ends at the first space and the length starts after
# the last one; the greedy `.+` gives exactly that split.
_TXT_LINE = re.compile(r"([0-9]+) (.+) ([0-9]+)")
_TSV_LINE = re.compile(r"([0-9]+)\t([A-Za-z0-9+/]*={0,2})")


class VocabError(SsmportError, ValueError):
    """A vocab file or table is malformed.

    ``str(err)`` is a single line naming the file (and line, when there is
    one); ``path``, ``line`` and ``reason`` hold the parts.
    """

    def __init__(self, reason: str, *, path: str | Path | None = None, line: int | None = None):
        self.reason = reason
        self.path = None if path is None else str(path)
        self.line = line
        where = self.path or "<vocab>"
        if line is not None:
            where = f"{where}:{line}"
        super().__init__(f"{where}: {reason}")


def detect_vocab_format(data: bytes, source: str | Path = "<vocab>") -> VocabFormat:
    """Tell the two formats apart by the first non-empty line (not the file name)."""
    for raw in data.split(b"\n"):
        line = raw.removeprefix(b"\xef\xbb\xbf").rstrip(b"\r")
        if not line:
            continue
        if re.match(rb"[0-9]+\t", line):
            return "tsv"
        if re.match(rb"[0-9]+ ", line):
            return "txt"
        break
    raise VocabError(
        "unrecognized vocab format: expected '<id> <literal> <length>' lines "
        "(rwkv_vocab_*.txt) or '<id>\\t<base64>' lines (vocab.tsv)",
        path=source,
    )


def parse_vocab(data: bytes, source: str | Path = "<vocab>") -> dict[int, bytes]:
    """Parse either format (detected by content) into ``{id: token bytes}``, sorted by id."""
    if detect_vocab_format(data, source) == "tsv":
        return parse_vocab_tsv(data, source)
    return parse_vocab_txt(data, source)


def load_vocab(path: str | Path) -> dict[int, bytes]:
    """Read a vocab file of either format; unreadable files are a :class:`VocabError` too."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise VocabError(f"cannot read vocab file: {exc.strerror or exc}", path=path) from exc
    return parse_vocab(data, path)


def _text_lines(data: bytes, source: str | Path) -> list[str]:
    """Decode UTF-8 and split on LF only (``str.splitlines`` would also split on
    U+2028, \\x1c, ... which are not line ends here).  A trailing CR is dropped so
    CRLF and LF files parse identically; a leading BOM is ignored."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise VocabError("line is not valid UTF-8", path=source, line=line) from None
    lines = text.removeprefix("\ufeff").split("\n")
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


class _Table:
    """Collects entries, rejecting duplicate ids / byte strings with both line numbers."""

    def __init__(self, source: str | Path):
        self.source = source
        self.by_id: dict[int, bytes] = {}
        self.id_line: dict[int, int] = {}
        self.bytes_line: dict[bytes, int] = {}

    def add(self, token_id: int, token: bytes, lineno: int) -> None:
        if token_id > MAX_TOKEN_ID:
            raise VocabError(f"token id {token_id} is too large", path=self.source, line=lineno)
        if not token:
            raise VocabError(f"token id {token_id} has an empty byte string", path=self.source, line=lineno)
        if token_id in self.id_line:
            raise VocabError(
                f"duplicate token id {token_id} (first defined on line {self.id_line[token_id]})",
                path=self.source, line=lineno,
            )
        if token in self.bytes_line:
            raise VocabError(
                f"duplicate token bytes {token!r} for id {token_id} "
                f"(already defined on line {self.bytes_line[token]})",
                path=self.source, line=lineno,
            )
        self.by_id[token_id] = token
        self.id_line[token_id] = lineno
        self.bytes_line[token] = lineno

    def result(self) -> dict[int, bytes]:
        if not self.by_id:
            raise VocabError("vocab file has no entries", path=self.source)
        return dict(sorted(self.by_id.items()))


def parse_vocab_txt(data: bytes, source: str | Path = "<vocab>") -> dict[int, bytes]:
    """Parse the original ``rwkv_vocab_*.txt`` format.

    Literals are read with :func:`ast.literal_eval` (never ``eval``) and must be
    ``str`` or ``bytes``; the declared byte length is checked for every entry.
    Completely empty lines are skipped.
    """
    table = _Table(source)
    for lineno, line in enumerate(_text_lines(data, source), start=1):
        if not line:
            continue
        m = _TXT_LINE.fullmatch(line)
        if m is None:
            raise VocabError(
                "expected '<id> <str or bytes literal> <byte length>'", path=source, line=lineno
            )
        token_id, literal, declared = int(m[1]), m[2].strip(), int(m[3])
        try:
            value = ast.literal_eval(literal)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise VocabError(f"bad token literal {literal[:60]!s}", path=source, line=lineno) from None
        if isinstance(value, str):
            try:
                token = value.encode("utf-8")
            except UnicodeEncodeError:
                raise VocabError(
                    f"string literal {literal[:60]!s} cannot be encoded as UTF-8", path=source, line=lineno
                ) from None
        elif isinstance(value, bytes):
            token = value
        else:
            raise VocabError(
                f"token literal must be a str or bytes literal, got {type(value).__name__}",
                path=source, line=lineno,
            )
        if len(token) != declared:
            raise VocabError(
                f"token id {token_id} is {len(token)} bytes but the line declares {declared}",
                path=source, line=lineno,
            )
        table.add(token_id, token, lineno)
    return table.result()


def parse_vocab_tsv(data: bytes, source: str | Path = "<vocab>") -> dict[int, bytes]:
    """Parse ssmport's ``vocab.tsv``: ``<id>\\t<base64>``, ids strictly ascending.

    Base64 must be canonical (what :func:`base64.b64encode` writes), so every
    byte of the file is meaningful and a flipped character cannot slip through
    unnoticed (e.g. in the ignored low bits before ``=`` padding).
    """
    table = _Table(source)
    previous = -1
    for lineno, line in enumerate(_text_lines(data, source), start=1):
        if not line:
            continue
        m = _TSV_LINE.fullmatch(line)
        if m is None:
            raise VocabError("expected '<id>\\t<base64 bytes>'", path=source, line=lineno)
        token_id, encoded = int(m[1]), m[2]
        try:
            token = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            raise VocabError(f"invalid base64 for token id {token_id}", path=source, line=lineno) from None
        if base64.b64encode(token).decode("ascii") != encoded:
            raise VocabError(f"non-canonical base64 for token id {token_id}", path=source, line=lineno)
        if token_id <= previous:
            raise VocabError(
                f"token id {token_id} is out of order (ids must be strictly ascending; previous {previous})",
                path=source, line=lineno,
            )
        previous = token_id
        table.add(token_id, token, lineno)
    return table.result()


def vocab_tsv_bytes(id_to_bytes: Mapping[int, bytes]) -> bytes:
    """Canonical ``vocab.tsv`` content for a table: sorted by id, LF endings."""
    return b"".join(
        b"%d\t%s\n" % (token_id, base64.b64encode(id_to_bytes[token_id]))
        for token_id in sorted(id_to_bytes)
    )


def find_vocab(model_path_or_dir: str | Path) -> Path | None:
    """Find the World vocab belonging to a model, or ``None``.

    * a directory (HF / fla checkpoint folder, exported bundle): look inside it;
    * a file (``.pth``, ``.safetensors``, ``config.json``, ...): look in its directory;
    * a path that already is a vocab file is returned as is.

    Looked for, in order: ``rwkv_vocab_v20230424.txt``, ``vocab.tsv``, then a
    single ``rwkv_vocab_*.txt`` (several different ones are ambiguous -> ``None``).
    """
    path = Path(model_path_or_dir)
    if path.is_file():
        if path.name in VOCAB_FILENAMES or re.fullmatch(r"rwkv_vocab_.*\.txt", path.name):
            return path
        path = path.parent
    if not path.is_dir():
        return None
    for name in VOCAB_FILENAMES:
        candidate = path / name
        if candidate.is_file():
            return candidate
    others = sorted(p for p in path.glob("rwkv_vocab_*.txt") if p.is_file())
    return others[0] if len(others) == 1 else None
