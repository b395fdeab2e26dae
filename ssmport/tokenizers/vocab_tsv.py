"""Export a World vocab as ``vocab.tsv`` and prove the export is faithful.

``vocab.tsv`` is the tokenizer file shipped next to an exported model:
``<id>\\t<base64(token bytes)>`` per line, ascending ids, LF endings.  Its
sha256 equals ``WorldTokenizer.fingerprint()``.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ssmport.files import write_output

from .corpus import verification_corpus
from .vocab_files import VocabError, parse_vocab_tsv, vocab_tsv_bytes
from .world import TokenizerError, WorldTokenizer


class VocabVerificationError(VocabError):
    """A ``vocab.tsv`` does not reproduce its source tokenizer exactly."""


@dataclass(frozen=True)
class VocabExportInfo:
    """What was written: ``sha256`` is of the file bytes (= tokenizer fingerprint)."""

    path: Path
    sha256: str
    entries: int
    size_bytes: int


def export_vocab_tsv(tokenizer_or_vocab_path: WorldTokenizer | str | Path, out_path: str | Path) -> VocabExportInfo:
    """Write ``out_path`` as canonical ``vocab.tsv`` and verify it.

    The content goes to a temporary file in the same directory, is flushed to
    disk, re-read and checked with :func:`verify_vocab_tsv`, and only then
    renamed over ``out_path``; on any failure the temporary file is removed and
    ``out_path`` is left as it was.  Raises :class:`VocabVerificationError` if
    the written file does not reproduce the source.
    """
    source = (
        tokenizer_or_vocab_path
        if isinstance(tokenizer_or_vocab_path, WorldTokenizer)
        else WorldTokenizer.from_file(tokenizer_or_vocab_path)
    )
    out_path = Path(out_path)
    data = vocab_tsv_bytes(source.id_to_bytes)
    verified: list[VocabExportInfo] = []
    # Written and fsynced to a temp file, re-read and verified there, then renamed over
    # out_path (or streamed to it, for a device or a pipe): out_path never holds a bad file.
    write_output(out_path, lambda f: f.write(data),
                 verify=lambda tmp: verified.append(_verify(tmp, source, display=out_path, corpus=None)))  # fmt: skip
    info = verified[0]
    _fsync_dir(out_path.parent)
    return VocabExportInfo(path=out_path, sha256=info.sha256, entries=info.entries, size_bytes=info.size_bytes)


def verify_vocab_tsv(
    path: str | Path, source_tokenizer: WorldTokenizer, *, corpus: Sequence[bytes] | None = None
) -> VocabExportInfo:
    """Check that ``path`` is exactly the canonical ``vocab.tsv`` of ``source_tokenizer``.

    Checks, in order: well-formed lines (LF only, canonical base64, ascending
    unique ids); the same id -> bytes entry for every id, no id missing or
    extra; byte-identical to the canonical serialization; a tokenizer built
    from the file encodes ``corpus`` (default: the built-in verification
    corpus) to the same ids as the source.  The first problem found raises
    :class:`VocabVerificationError` naming the file and line.
    """
    return _verify(Path(path), source_tokenizer, display=Path(path), corpus=corpus)


def _verify(
    path: Path, source: WorldTokenizer, *, display: Path, corpus: Sequence[bytes] | None
) -> VocabExportInfo:
    def fail(reason: str, line: int | None = None) -> VocabVerificationError:
        return VocabVerificationError(f"vocab.tsv verification failed: {reason}", path=display, line=line)

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise fail(f"cannot read file: {exc.strerror or exc}") from exc
    if b"\r" in data:
        raise fail("CR found; vocab.tsv must use LF line endings", _line_at(data, data.index(b"\r")))
    if not data.endswith(b"\n"):
        raise fail("missing final newline (truncated file?)", _line_at(data, len(data)))
    try:
        table = parse_vocab_tsv(data, display)
    except VocabError as exc:
        raise fail(exc.reason, exc.line) from None

    expected = source.id_to_bytes
    for lineno, (token_id, token) in enumerate(expected.items(), start=1):
        got = table.get(token_id)
        if got is None:
            raise fail(f"token id {token_id} is missing (it belongs on this line)", lineno)
        if got != token:
            raise fail(f"token id {token_id} is {got!r}, source has {token!r}", _line_of_id(data, token_id))
    extra = table.keys() - expected.keys()
    if extra:
        token_id = min(extra)
        raise fail(f"unexpected token id {token_id} (not in source)", _line_of_id(data, token_id))

    canonical = vocab_tsv_bytes(expected)
    if data != canonical:
        # Same table, different bytes (e.g. blank lines): point at the first bad line.
        pairs = itertools.zip_longest(data.split(b"\n"), canonical.split(b"\n"))
        for lineno, (a, b) in enumerate(pairs, start=1):
            if a != b:
                raise fail("line differs from the canonical serialization", lineno)
        raise fail("file length differs from the canonical serialization")

    rebuilt = WorldTokenizer(table, source=display)
    for sample in verification_corpus(expected) if corpus is None else corpus:
        try:
            expected_ids = source.encode(sample)
        except TokenizerError as exc:  # a vocab without every single byte cannot encode arbitrary text
            raise fail(f"the vocab cannot encode the verification text ({exc}); a World vocab holds all 256 single bytes") from None
        if rebuilt.encode(sample) != expected_ids:
            raise fail(f"encodes {sample[:40]!r}... differently from the source tokenizer")

    return VocabExportInfo(
        path=display, sha256=hashlib.sha256(data).hexdigest(), entries=len(table), size_bytes=len(data)
    )


def _line_at(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def _line_of_id(data: bytes, token_id: int) -> int | None:
    key = b"%d\t" % token_id
    if data.startswith(key):
        return 1
    offset = data.find(b"\n" + key)
    return None if offset < 0 else _line_at(data, offset + 1)


def _fsync_dir(directory: Path) -> None:
    # Makes the rename durable; not possible on every platform/filesystem.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
