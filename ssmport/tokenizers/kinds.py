"""Which tokenizer a file is, where one is found next to a model, and loading either kind.

Two kinds: the RWKV World vocab (`rwkv_vocab_*.txt` / `vocab.tsv`, `WorldTokenizer`) and a
Hugging Face `tokenizer.json` (`HFJsonTokenizer`), told apart by the file name.
"""

from __future__ import annotations

from pathlib import Path

from .hf_json import HF_JSON_KIND, HF_TOKENIZER_FILENAME, HFJsonTokenizer, hf_json_vocab_size, is_hf_tokenizer_json
from .vocab_files import find_vocab

WORLD_KIND = "rwkv-world"


def tokenizer_kind(path: str | Path) -> str:
    return HF_JSON_KIND if is_hf_tokenizer_json(path) else WORLD_KIND


def find_tokenizer(model_dir: str | Path) -> Path | None:
    """A World vocab next to the model (see `find_vocab`), else its `tokenizer.json`."""
    found = find_vocab(model_dir)
    if found is not None:
        return found
    path = Path(model_dir)
    folder = path if path.is_dir() else path.parent
    candidate = folder / HF_TOKENIZER_FILENAME
    return candidate if candidate.is_file() else None


def load_tokenizer(path: str | Path):
    """A `WorldTokenizer` or `HFJsonTokenizer` for the file (encode / decode_text / stream)."""
    if tokenizer_kind(path) == HF_JSON_KIND:
        return HFJsonTokenizer(path)
    from .world import WorldTokenizer

    return WorldTokenizer.from_file(path)


def tokenizer_vocab_size(path: str | Path) -> int:
    """Largest id + 1 (without needing the optional `tokenizers` package)."""
    if tokenizer_kind(path) == HF_JSON_KIND:
        return hf_json_vocab_size(path)
    from .world import WorldTokenizer

    return WorldTokenizer.from_file(path).vocab_size
