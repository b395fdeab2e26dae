"""What every tokenizer ssmport runs offers, and the streaming decoder they share.

Both kinds (`WorldTokenizer`, `HFJsonTokenizer`) map each id to its exact bytes, so
generation, chat and stop strings work on bytes whatever the tokenizer: a reply can stop in
the middle of a multi-byte character without mis-counting, and text is produced by one
incremental UTF-8 decoder.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterable
from typing import Protocol


class Tokenizer(Protocol):
    kind: str  # "rwkv-world" | "hf-json" (the manifest's tokenizer kind)

    @property
    def vocab_size(self) -> int: ...  # largest id + 1

    @property
    def eos_ids(self) -> tuple[int, ...]: ...  # ids that end a generation

    def encode(self, text: str | bytes) -> list[int]: ...

    def token_bytes(self, token_id: int) -> bytes | None:  # None: an id with no text (special)
        ...

    def decode(self, ids: Iterable[int]) -> bytes: ...

    def decode_text(self, ids: Iterable[int]) -> str: ...

    def stream(self) -> StreamDecoder: ...


class StreamDecoder:
    """Incremental id -> text decoding for streaming output.

    ``feed(id)`` returns the text completed so far ('' while a multi-byte character is still
    split across tokens); ``flush()`` returns the rest. Invalid bytes become U+FFFD as soon as
    they are known to be invalid. For any id sequence, ``"".join(feed(i) for i in ids) +
    flush()`` equals ``decode(ids).decode("utf-8", "replace")`` exactly: CPython's incremental
    UTF-8 decoder only holds back a trailing *valid* incomplete sequence and otherwise makes the
    same replacement decisions as a one-shot decode.
    """

    def __init__(self, token_bytes: Callable[[int], bytes]):
        """``token_bytes(id)`` returns the id's bytes or raises for an id it cannot decode."""
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        """Add one id; return newly completed text. An unknown id raises and leaves the
        state unchanged."""
        return self._decoder.decode(self._token_bytes(token_id))

    def flush(self) -> str:
        """End of stream: return the remaining text (an incomplete trailing sequence becomes
        U+FFFD) and reset for reuse."""
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text

    def reset(self) -> None:
        """Drop any held-back bytes."""
        self._decoder.reset()

    @property
    def pending(self) -> bytes:
        """Bytes held back because they may start a multi-byte character."""
        return self._decoder.getstate()[0]
