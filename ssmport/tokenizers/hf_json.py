"""Hugging Face `tokenizer.json` (GPT-NeoX BPE and friends), through the `tokenizers` library.

The file is copied into bundles byte for byte; encoding and decoding are the `tokenizers`
package's (an optional dependency: `pip install 'ssmport[hf]'`). Reading the vocabulary size
for checks needs only the JSON, so exporting works without the package.
"""

from __future__ import annotations

import json
from pathlib import Path

from ssmport.errors import SsmportError
from ssmport.tokenizers.protocol import StreamDecoder

HF_TOKENIZER_FILENAME = "tokenizer.json"
HF_JSON_KIND = "hf-json"
# End-of-text spellings tried in order (tokenizer.json itself does not say which is EOS).
_END_OF_TEXT_TOKENS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")


def is_hf_tokenizer_json(path: str | Path) -> bool:
    return Path(path).suffix == ".json"


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SsmportError(f"{path}: not a readable tokenizer.json ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise SsmportError(f"{path}: not a Hugging Face tokenizer.json (no 'model' object)")
    return data


def hf_json_vocab_size(path: str | Path) -> int:
    """Largest id + 1 over the model's vocabulary and the added tokens (JSON only)."""
    data = _read_json(Path(path))
    vocab = data["model"].get("vocab") or {}
    ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))  # Unigram: a list
    ids += [t.get("id", -1) for t in data.get("added_tokens") or [] if isinstance(t, dict)]
    ids = [i for i in ids if isinstance(i, int)]
    if not ids:
        raise SsmportError(f"{path}: tokenizer.json has an empty vocabulary")
    return max(ids) + 1


class HFJsonTokenizer:
    """The `Tokenizer` protocol over a `tokenizer.json`, run by the `tokenizers` package.

    Token bytes come from the file's own byte mapping: the GPT-2 byte-to-unicode alphabet of a
    ByteLevel decoder (GPT-NeoX, Qwen, Granite ...), or SentencePiece's `<0xNN>` byte fallback
    and the `▁` space; special tokens have no bytes.
    """

    kind = HF_JSON_KIND

    def __init__(self, path: str | Path):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise SsmportError(
                f"{path}: reading tokenizer.json needs the `tokenizers` package: pip install 'ssmport[hf]'"
            ) from None
        self.source = str(path)
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises its own Exception types
            raise SsmportError(f"{path}: not a loadable tokenizer.json ({exc})") from None
        data = _read_json(Path(path))
        self._byte_level = _uses_byte_level(data.get("decoder"))
        self._special = {t["id"] for t in data.get("added_tokens") or [] if isinstance(t, dict) and t.get("special")}
        self._bytes_cache: dict[int, bytes | None] = {}
        found = (self._tok.token_to_id(t) for t in _END_OF_TEXT_TOKENS)
        eos = next((i for i in found if i is not None), None)
        self.eos_ids: tuple[int, ...] = () if eos is None else (eos,)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str | bytes) -> list[int]:
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", errors="replace")
        return self._tok.encode(text, add_special_tokens=False).ids

    def token_bytes(self, token_id: int) -> bytes | None:
        if token_id not in self._bytes_cache:
            self._bytes_cache[token_id] = self._lookup_bytes(token_id)
        return self._bytes_cache[token_id]

    def _lookup_bytes(self, token_id: int) -> bytes | None:
        piece = self._tok.id_to_token(int(token_id)) if isinstance(token_id, int) and token_id >= 0 else None
        if piece is None or token_id in self._special:
            return None
        if self._byte_level:
            try:
                return bytes(_UNICODE_TO_BYTE[ch] for ch in piece)
            except KeyError:  # an added, non-special token written as plain text
                return piece.encode("utf-8")
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes((int(piece[3:5], 16),))
        return piece.replace("\u2581", " ").encode("utf-8")

    def _known_bytes(self, token_id: int) -> bytes:
        value = self.token_bytes(token_id)
        return b"" if value is None else value

    def decode(self, ids) -> bytes:
        return b"".join(self._known_bytes(i) for i in ids)

    def decode_text(self, ids) -> str:
        return self.decode(ids).decode("utf-8", errors="replace")

    def stream(self) -> StreamDecoder:
        return StreamDecoder(self._known_bytes)


def _uses_byte_level(decoder) -> bool:
    """Whether a tokenizer.json decoder (possibly a Sequence) includes ByteLevel."""
    if not isinstance(decoder, dict):
        return False
    if decoder.get("type") == "ByteLevel":
        return True
    return any(_uses_byte_level(d) for d in decoder.get("decoders") or [])


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character alphabet of byte-level BPE: the printable
    Latin-1 bytes stand for themselves, the other 68 take the characters from U+0100 up."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_UNICODE_TO_BYTE = {ch: b for b, ch in _byte_to_unicode().items()}
