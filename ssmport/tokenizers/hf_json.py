"""Hugging Face `tokenizer.json` (GPT-NeoX BPE and friends), through the `tokenizers` library.

The file is copied into bundles byte for byte; encoding and decoding are the `tokenizers`
package's (an optional dependency: `pip install 'ssmport[hf]'`). Reading the vocabulary size
for checks needs only the JSON, so exporting works without the package.
"""

from __future__ import annotations

import json
from pathlib import Path

from ssmport.errors import SsmportError

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
    """encode / decode / stream over a `tokenizer.json`, like `WorldTokenizer`."""

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
        found = (self._tok.token_to_id(t) for t in _END_OF_TEXT_TOKENS)
        self.end_of_text: int | None = next((i for i in found if i is not None), None)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode_text(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def stream(self) -> HFStreamDecoder:
        return HFStreamDecoder(self)


class HFStreamDecoder:
    """Incremental decoding: text is released once it no longer ends in a split character.

    Decodes the ids since the last released boundary (byte-level BPE merges only within
    those), so `"".join(feed(i) for i in ids) + flush()` equals `decode_text(ids)`.
    """

    def __init__(self, tokenizer: HFJsonTokenizer):
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._released = 0  # characters of decode_text(self._ids) already returned

    def feed(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        text = self._tokenizer.decode_text(self._ids)
        if text.endswith("\ufffd"):  # a multi-byte character is still split across tokens
            return ""
        new, self._released = text[self._released :], len(text)
        return new

    def flush(self) -> str:
        text = self._tokenizer.decode_text(self._ids)
        rest = text[self._released :]
        self._ids, self._released = [], 0
        return rest
