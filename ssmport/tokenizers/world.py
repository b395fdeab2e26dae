"""RWKV World tokenizer: greedy longest match over UTF-8 bytes.

Semantics (identical to the reference ``rwkv.rwkv_tokenizer.TRIE_TOKENIZER``):
starting at byte 0, take the longest vocab token that is a prefix of the
remaining input, emit its id, continue after it.  Byte strings are unique, so
there are no ties.  This is not BPE and not an optimal segmentation: a longer
first token always wins even if it forces more tokens later.

Speed: the obvious pure-Python trie walk costs several bytecodes per input
byte.  Instead the vocab trie is compiled once into a regular expression whose
leftmost match is the longest token at a position (`trie_regex`), so the
walking is done by the stdlib ``re`` engine in C.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType

from ssmport.errors import SsmportError

from .protocol import StreamDecoder
from .trie_regex import trie_regex
from .vocab_files import (
    MAX_TOKEN_ID,
    VocabError,
    find_vocab,
    load_vocab,
    vocab_tsv_bytes,
)

# Input is matched in windows of this many bytes so that the intermediate list
# of matched byte strings stays small for huge inputs.
_CHUNK_BYTES = 1 << 20



class TokenizerError(SsmportError, ValueError):
    """Encoding or decoding failed (unknown id, input the vocab cannot cover, ...)."""


# Each byte as a latin-1 character, escaped the way `re` escapes a bytes pattern.
_LATIN1_ESCAPED = [re.escape(chr(b)) for b in range(256)]


def _latin1_atom(byte: int, in_class: bool) -> str:
    return _LATIN1_ESCAPED[byte]


def _trie_regex_source(tokens: Iterable[bytes]) -> bytes:
    """Bytes regex whose leftmost match at any position is the longest token that
    prefixes the input there (see `trie_regex`).

    A final ``|.`` alternative consumes one byte where no token matches, so that
    ``findall`` leaves no gaps and the caller can report the offending byte.
    """
    source = trie_regex(tokens, _latin1_atom)
    return (source + "|." if source else ".").encode("latin-1")


class WorldTokenizer:
    """RWKV World tokenizer over an ``{id: token bytes}`` table.

    ``encode`` gives exactly the ids of the reference ``TRIE_TOKENIZER``.
    The matching regex is compiled lazily on the first ``encode`` (about a
    second for the 65,529-entry World vocab); decoding never needs it.
    """

    kind = "rwkv-world"
    eos_ids = (0,)  # World's end-of-text id (generation stops there)

    def __init__(self, id_to_bytes: Mapping[int, bytes], *, source: str | Path | None = None):
        """``id_to_bytes``: unique non-empty byte strings keyed by ids >= 0."""
        self.source = None if source is None else str(source)
        table: dict[int, bytes] = {}
        to_id: dict[bytes, int] = {}
        for token_id, token in sorted(id_to_bytes.items()):
            if type(token_id) is not int or not 0 <= token_id <= MAX_TOKEN_ID:
                raise VocabError(f"invalid token id {token_id!r}", path=source)
            if not isinstance(token, bytes) or not token:
                raise VocabError(f"token id {token_id} must map to non-empty bytes, got {token!r}", path=source)
            if token in to_id:
                raise VocabError(
                    f"token ids {to_id[token]} and {token_id} have the same bytes {token!r}", path=source
                )
            table[token_id] = token
            to_id[token] = token_id
        if not table:
            raise VocabError("vocab is empty", path=source)
        self._id_to_bytes = table
        self._bytes_to_id = to_id
        self._max_token_len = max(map(len, to_id))
        self._regex: re.Pattern[bytes] | None = None
        self._regex_lock = threading.Lock()
        self._fingerprint: str | None = None

    @classmethod
    def from_file(cls, path: str | Path) -> WorldTokenizer:
        """Load ``rwkv_vocab_*.txt`` or an exported ``vocab.tsv`` (format detected
        from the content).  A directory is searched with :func:`find_vocab`."""
        path = Path(path)
        if path.is_dir():
            found = find_vocab(path)
            if found is None:
                raise VocabError("no RWKV World vocab file in this directory", path=path)
            path = found
        return cls(load_vocab(path), source=path)

    # -- table access -------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Largest id + 1 (65530 for the World vocab, whose ids are 1..65529)."""
        return next(reversed(self._id_to_bytes)) + 1

    @property
    def id_to_bytes(self) -> Mapping[int, bytes]:
        """Read-only ``{id: token bytes}``, in ascending id order."""
        return MappingProxyType(self._id_to_bytes)

    @property
    def max_token_length(self) -> int:
        """Length in bytes of the longest token (128 for the World vocab)."""
        return self._max_token_len

    def token_bytes(self, token_id: int) -> bytes | None:
        """The bytes of one id; None for an id with no token (0, end of text, included)."""
        return self._id_to_bytes.get(token_id)

    def token_to_id(self, token: bytes) -> int | None:
        """Id of an exact token byte string, or ``None``."""
        return self._bytes_to_id.get(token)

    def fingerprint(self) -> str:
        """sha256 hex digest of the canonical id -> bytes table.

        Defined as the sha256 of the canonical ``vocab.tsv`` serialization, so
        it equals the sha256 of a file written by ``export_vocab_tsv``.
        """
        if self._fingerprint is None:
            self._fingerprint = hashlib.sha256(vocab_tsv_bytes(self._id_to_bytes)).hexdigest()
        return self._fingerprint

    def __repr__(self) -> str:
        return f"WorldTokenizer(entries={len(self._id_to_bytes)}, vocab_size={self.vocab_size}, source={self.source!r})"

    # -- encoding -----------------------------------------------------------

    def warm_up(self) -> WorldTokenizer:
        """Compile the matcher now instead of on the first ``encode``."""
        self._matcher()
        return self

    def _matcher(self) -> re.Pattern[bytes]:
        if self._regex is None:
            with self._regex_lock:
                if self._regex is None:
                    source = _trie_regex_source(self._bytes_to_id)
                    try:
                        self._regex = re.compile(source, re.DOTALL)
                    except RecursionError:
                        raise TokenizerError(
                            "vocab trie is nested too deeply for the regex-based encoder "
                            f"(longest token {self._max_token_len} bytes)"
                        ) from None
        return self._regex

    def encode(self, text: str | bytes) -> list[int]:
        """Token ids for ``text``: a ``str`` is UTF-8 encoded first; any byte
        string (invalid UTF-8 included) encodes as long as the vocab covers it
        (the World vocab has all 256 single bytes)."""
        if isinstance(text, str):
            data = text.encode("utf-8")
        elif isinstance(text, (bytes, bytearray, memoryview)):
            data = bytes(text)
        else:
            raise TypeError(f"encode() takes str or bytes, not {type(text).__name__}")
        matcher = self._matcher()
        lookup = self._bytes_to_id.__getitem__
        # A match starting at p reads at most data[p : p + max_token_len], so in
        # a window ending at `end` the matches starting at or before
        # end - max_token_len are final; the rest is re-matched in the next window.
        chunk = max(_CHUNK_BYTES, 4 * self._max_token_len)
        ids: list[int] = []
        pos, n = 0, len(data)
        while pos < n:
            end = min(n, pos + chunk)
            pieces = matcher.findall(data, pos, end)
            stop = end
            if end < n:
                limit = end - self._max_token_len
                while stop - len(pieces[-1]) > limit:
                    stop -= len(pieces.pop())
            try:
                ids.extend(map(lookup, pieces))
            except KeyError:
                raise self._not_encodable(data, pos, pieces) from None
            pos = stop
        return ids

    def _not_encodable(self, data: bytes, pos: int, pieces: list[bytes]) -> TokenizerError:
        for piece in pieces:
            if piece not in self._bytes_to_id:
                return TokenizerError(
                    f"cannot encode byte 0x{data[pos]:02x} at offset {pos}: "
                    "no vocab token matches the input there"
                )
            pos += len(piece)
        return TokenizerError("internal error: unmatched piece not found")  # pragma: no cover

    # -- decoding -----------------------------------------------------------

    def decode(self, ids: Iterable[int]) -> bytes:
        """Concatenated token bytes.  Unknown ids (including 0 for the World
        vocab) raise :class:`TokenizerError`."""
        ids = ids if isinstance(ids, (list, tuple)) else list(ids)
        try:
            return b"".join(map(self._id_to_bytes.__getitem__, ids))
        except (KeyError, TypeError):
            raise self._unknown_id(ids) from None

    def decode_text(self, ids: Iterable[int]) -> str:
        """``decode`` as text; invalid UTF-8 becomes U+FFFD (``errors="replace"``)."""
        return self.decode(ids).decode("utf-8", errors="replace")

    def _unknown_id(self, ids: list[int] | tuple[int, ...]) -> TokenizerError:
        for position, token_id in enumerate(ids):
            try:
                self._id_to_bytes[token_id]
            except (KeyError, TypeError):
                return TokenizerError(
                    f"unknown token id {token_id!r} at position {position} "
                    f"(vocab has {len(self._id_to_bytes)} ids, vocab_size {self.vocab_size})"
                )
        return TokenizerError("internal error: unknown id not found")  # pragma: no cover

    def stream(self) -> StreamDecoder:
        """A fresh :class:`StreamDecoder` for printing ids as they are generated."""
        return StreamDecoder(self._known_token_bytes)

    def _known_token_bytes(self, token_id: int) -> bytes:
        try:
            return self._id_to_bytes[token_id]
        except (KeyError, TypeError):
            raise self._unknown_id([token_id]) from None
