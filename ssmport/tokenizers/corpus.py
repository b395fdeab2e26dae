"""Deterministic text corpus for checking World tokenizers against each other.

Used by ``export_vocab_tsv`` (a small built-in verification corpus) and by the
tests (a larger one from the same builder).  Everything is bytes, because the
tokenizer works on bytes and invalid UTF-8 must be covered too.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

# Hand-picked cases, each a known tricky spot for a byte-level tokenizer.
_SAMPLES: tuple[str | bytes, ...] = (
    "",
    # ASCII prose and punctuation
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "It's 3:45 p.m. -- isn't it?  \"Quotes\", (parens) [brackets] {braces} <angle> @#$%^&*_+=|\\~`",
    # code
    "def f(x: int) -> int:\n    if x <= 1:\n        return x\n    return f(x - 1) + f(x - 2)\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    '{"ids": [1, 2, 3], "name": "rwkv", "ok": true, "nested": {"k": null}}\n',
    "<div class=\"x\">&amp;&lt;</div>\n#include <stdio.h>\nSELECT * FROM t WHERE id = 42;",
    # whitespace runs
    " ", "  ", "   x", "\t\t\tx", "\n\n\n", "\r\n\r\n", " \n \n", " " * 17 + "end", "\t \t \n" * 5,
    # CJK
    "你好，世界！这是一个测试。人工智能正在改变世界。",
    "日本語のテキスト、ひらがなとカタカナ。", "한국어 텍스트입니다.",
    # emoji: ZWJ families, flags, skin tones, keycaps, variation selectors
    "👩\u200d👩\u200d👧\u200d👦 👨🏽\u200d💻 🇯🇵🇺🇸 👍🏿 1\ufe0f\u20e3 ❤\ufe0f 🏳\ufe0f\u200d🌈",
    # combining marks
    "e\u0301 a\u0308 n\u0303 Z\u0324\u0354\u0367\u0311\u0313a\u0308\u0356\u036dl\u036e\u0312\u036bg\u030c\u0317\u035a",
    "Tiếng Việt có dấu: Người đẹp, chữ Quốc ngữ.",
    # right-to-left, with bidi controls
    "مرحبا بالعالم", "שָׁלוֹם עוֹלָם", "abc \u202eRTL override\u202c \u200fmark\u200e",
    # other scripts
    "Привет, мир! Ελληνικά. ภาษาไทย हिन्दी भाषा ∀x∈ℝ: x²≥0 → ∑ᵢ½",
    # control characters and unusual line/format characters
    "\x00\x01\x02\x1b[31mred\x1b[0m\x7f\x0b\x0c\x1c\x1d\x1e\x1f",
    "line\u2028sep\u2029para\x85nel\ufeffbom\u200bzwsp",
    # very long words / runs
    "a" * 1000,
    "Pneumonoultramicroscopicsilicovolcanoconiosis" * 20,
    "=" * 300, "#" * 200, "-" * 129, "1234567890" * 50, " " * 500, "\n" * 200,
    "你" * 300,
    # invalid UTF-8: stray continuation, truncated, overlong, surrogate, > U+10FFFF
    b"\x80", b"\xff\xfe\xfd", b"\xc3", b"\xe4\xbd", b"\xf0\x9f\x98",
    b"\xc0\xaf\xe0\x80\xaf", b"\xed\xa0\x80\xed\xbf\xbf", b"\xf4\x90\x80\x80",
    b"ok \xe4\xbd\xa0\xe5 broken \xf0\x9f\x98\x80\x80 end\xff",
    bytes(range(256)),
    bytes(range(255, -1, -1)),
)


def is_utf8(data: bytes) -> bool:
    """Whether a corpus sample is valid UTF-8 (a text every tokenizer API accepts)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def sample_texts() -> list[bytes]:
    """The hand-picked cases as UTF-8 (or deliberately invalid) bytes."""
    return [s.encode("utf-8") if isinstance(s, str) else s for s in _SAMPLES]


def random_byte_strings(rng: random.Random, count: int, max_len: int = 300) -> list[bytes]:
    """Uniformly random bytes: mostly invalid UTF-8, every byte value."""
    return [rng.randbytes(rng.randint(1, max_len)) for _ in range(count)]


def random_unicode_strings(rng: random.Random, count: int, max_chars: int = 100) -> list[bytes]:
    """Random code points from all planes (surrogates skipped), as UTF-8."""
    out = []
    for _ in range(count):
        chars = []
        for _ in range(rng.randint(1, max_chars)):
            limit = rng.choice((0x7F, 0x7FF, 0xFFFF, 0x10FFFF))
            cp = rng.randint(0, limit)
            chars.append(chr(cp if not 0xD800 <= cp <= 0xDFFF else 0xFFFD))
        out.append("".join(chars).encode("utf-8"))
    return out


def random_token_mixes(
    id_to_bytes: Mapping[int, bytes], rng: random.Random, count: int, max_tokens: int = 60
) -> list[bytes]:
    """Concatenations of random vocab tokens, sometimes with a random byte in
    between: these hit token boundaries where greedy matching is interesting."""
    tokens = list(id_to_bytes.values())
    out = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, max_tokens)):
            parts.append(rng.choice(tokens))
            if rng.random() < 0.1:
                parts.append(bytes((rng.randrange(256),)))
        out.append(b"".join(parts))
    return out


def build_corpus(
    id_to_bytes: Mapping[int, bytes] | None = None,
    *,
    seed: int = 20230424,
    random_bytes: int = 16,
    random_unicode: int = 16,
    token_mixes: int = 32,
) -> list[bytes]:
    """Hand-picked samples + seeded random strings (+ token mixes if a vocab
    table is given).  Same arguments -> same corpus."""
    rng = random.Random(seed)
    corpus = sample_texts()
    corpus += random_byte_strings(rng, random_bytes)
    corpus += random_unicode_strings(rng, random_unicode)
    if id_to_bytes:
        corpus += random_token_mixes(id_to_bytes, rng, token_mixes)
    return corpus


def verification_corpus(id_to_bytes: Mapping[int, bytes] | None = None) -> list[bytes]:
    """Small corpus (a few tens of KB) used by ``export_vocab_tsv``'s self-check."""
    return build_corpus(id_to_bytes)
