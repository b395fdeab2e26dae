"""The RWKV World vocab as a Hugging Face ``tokenizer.json`` that reproduces ``WorldTokenizer``.

World tokenization is greedy longest match over UTF-8 bytes, which no ``tokenizers`` model
does by itself. The construction (exact for every valid Unicode text, decode included):

* **bytes as characters**: a ``ByteLevel`` pre-tokenizer (no regex, no prefix space) turns
  the text's UTF-8 bytes into GPT-2's byte-level characters, one character per byte, so
  tokens that are partial UTF-8 (the World vocab has many) are ordinary strings;
* **the greedy parse in the pre-tokenizer**: a ``Split`` pre-tokenizer (``Isolated``)
  whose regex is the vocab trie (`trie_regex`): its leftmost match at a position is the
  longest token there, so the pieces *are* the greedy tokens. Leftmost-first alternation
  is what Oniguruma (``tokenizers``), ICU (swift-transformers) and JavaScript (tokenizers.js)
  all implement; the work is linear in the input, with no per-word quadratic search;
* **one piece, one id**: a ``BPE`` model with ``ignore_merges`` maps each piece, always a
  vocab token, straight to its id. The merges exist for consumers that always run BPE
  (swift-transformers has no ``ignore_merges``): built so that BPE over any vocab token's
  characters ends in that token. That needs merge results outside the World vocab (2,238
  tokens cannot be written as two vocab tokens, e.g. b" \\xcc\\x87"), which get ids at or
  above the model's vocab size so no id a model can emit decodes to one of them;
* **decode**: a ``ByteLevel`` decoder maps the characters back to bytes and decodes UTF-8
  with replacement, like ``WorldTokenizer.decode_text``.

Id 0 (World's end of text, not in the vocab file) is the special token
``<|rwkv_tokenizer_end_of_text|>``, as in Hugging Face's RWKV tokenizers. Like every special
token, its literal spelling in input text is encoded as id 0 (``WorldTokenizer`` encodes its
bytes); ``Tokenizer.encode_special_tokens = True`` turns that off.

The ``tokenizers`` API takes text (a Rust ``String``), so invalid UTF-8 cannot be passed as
such. `byte_level_text` spells arbitrary bytes in the byte-level alphabet; fed to the
variant from `raw_bytes_tokenizer_json` (the same file without the ``ByteLevel`` step) they
encode exactly as ``WorldTokenizer.encode(bytes)``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache

from .trie_regex import trie_regex
from .world import WorldTokenizer

END_OF_TEXT = "<|rwkv_tokenizer_end_of_text|>"
END_OF_TEXT_ID = 0

# Characters a regex must escape: outside a class, the syntax characters common to
# Oniguruma, ICU and JavaScript; inside one, those that end or shape the class. Only these
# are escaped, since JavaScript's `u` mode rejects escapes of anything else.
_SYNTAX = frozenset("\\^$.|?*+()[]{}")
_CLASS_SYNTAX = frozenset("\\]^-[")
_BYTE_LEVEL_STEP = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}


@lru_cache(maxsize=1)
def byte_to_unicode() -> tuple[str, ...]:
    """GPT-2's byte-level alphabet: the character standing for each byte 0..255.

    Printable latin-1 bytes stand for themselves; the other 68 take U+0100 upward, in byte
    order. This is the table of the ``ByteLevel`` pre-tokenizer and decoder.
    """
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    others = (b for b in range(256) if b not in chars)
    chars.update((b, chr(0x100 + n)) for n, b in enumerate(others))
    return tuple(chars[b] for b in range(256))


def byte_level_text(data: bytes) -> str:
    """``data`` spelled in the byte-level alphabet (for `raw_bytes_tokenizer_json`)."""
    table = byte_to_unicode()
    return "".join(table[b] for b in data)


def _atom(byte: int, in_class: bool) -> str:
    char = byte_to_unicode()[byte]
    return "\\" + char if char in (_CLASS_SYNTAX if in_class else _SYNTAX) else char


def _bpe(word: str, ranks: Mapping[tuple[str, str], int]) -> list[str]:
    """BPE as swift-transformers and GPT-2 run it: merge every occurrence of the
    lowest-ranked adjacent pair, left to right, until no ranked pair is left."""
    parts = list(word)
    while len(parts) > 1:
        ranked = [(ranks[p], p) for p in zip(parts, parts[1:]) if p in ranks]
        if not ranked:
            break
        _, (a, b) = min(ranked)
        merged, i = [], 0
        while i < len(parts):
            if i + 1 < len(parts) and parts[i] == a and parts[i + 1] == b:
                merged.append(a + b)
                i += 2
            else:
                merged.append(parts[i])
                i += 1
        parts = merged
    return parts


def _closing_merges(tokens: list[str], vocab: Mapping[str, int]) -> tuple[list[tuple[str, str]], list[str]]:
    """Merges under which BPE turns every token's characters into that token, and the
    merge results that are not tokens themselves (in the order they first appear).

    Tokens are taken shortest first; while BPE leaves a token in several parts, the first
    two are merged by a new, lowest-priority merge. A new merge never changes an earlier
    token's result: that run found a ranked pair at every step, which still outranks it.
    """
    ranks: dict[tuple[str, str], int] = {}
    helpers: dict[str, None] = {}
    for token in sorted(tokens, key=lambda t: (len(t), t)):
        while len(parts := _bpe(token, ranks)) > 1:
            pair = (parts[0], parts[1])
            ranks[pair] = len(ranks)
            if pair[0] + pair[1] not in vocab:
                helpers.setdefault(pair[0] + pair[1])
    return list(ranks), list(helpers)


def world_tokenizer_json(tokenizer: WorldTokenizer, model_vocab_size: int | None = None) -> str:
    """The ``tokenizer.json`` text for a World vocab (see the module docstring).

    ``model_vocab_size``: the model's embedding rows; merge helpers get ids from there up
    (default: the vocab size rounded up to a multiple of 64, World models' padding).
    """
    size = tokenizer.vocab_size
    first_helper = model_vocab_size if model_vocab_size is not None else -(-size // 64) * 64
    if first_helper < size:
        raise ValueError(f"model_vocab_size {first_helper} is smaller than the vocab ({size} ids)")
    table = byte_to_unicode()
    vocab = {"".join(table[b] for b in token): token_id for token_id, token in tokenizer.id_to_bytes.items()}
    if END_OF_TEXT_ID in tokenizer.id_to_bytes:
        raise ValueError(f"id {END_OF_TEXT_ID} is a vocab token; it is reserved for {END_OF_TEXT}")
    merges, helpers = _closing_merges(list(vocab), vocab)
    vocab[END_OF_TEXT] = END_OF_TEXT_ID
    vocab.update((helper, first_helper + n) for n, helper in enumerate(helpers))
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": END_OF_TEXT_ID,
                "content": END_OF_TEXT,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                dict(_BYTE_LEVEL_STEP),
                {
                    "type": "Split",
                    "pattern": {"Regex": trie_regex(tokenizer.id_to_bytes.values(), _atom)},
                    "behavior": "Isolated",
                    "invert": False,
                },
            ],
        },
        "post_processor": None,
        "decoder": dict(_BYTE_LEVEL_STEP),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": True,
            "vocab": vocab,
            "merges": [list(pair) for pair in merges],
        },
    }
    return json.dumps(spec, ensure_ascii=False)


def raw_bytes_tokenizer_json(json_text: str) -> str:
    """The same tokenizer for input already spelled with `byte_level_text`: the
    ``ByteLevel`` pre-tokenizer step dropped, everything else unchanged."""
    spec = json.loads(json_text)
    steps = spec["pre_tokenizer"]["pretokenizers"]
    spec["pre_tokenizer"] = next(step for step in steps if step["type"] == "Split")
    return json.dumps(spec, ensure_ascii=False)
