"""The World vocab as a Hugging Face tokenizer.json: id-for-id with WorldTokenizer, decode included.

WorldTokenizer is itself tied id-for-id to the `rwkv` package's reference (test_tokenizer_world.py);
here the same corpus (same builder, same seed) goes through the `tokenizers` package.
"""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import Tokenizer

from ssmport.tokenizers import BUNDLED_WORLD_VOCAB, WorldTokenizer, build_corpus
from ssmport.tokenizers.corpus import is_utf8
from ssmport.tokenizers.world_json import (
    END_OF_TEXT,
    byte_level_text,
    byte_to_unicode,
    raw_bytes_tokenizer_json,
    world_tokenizer_json,
)


@pytest.fixture(scope="module")
def world() -> WorldTokenizer:
    return WorldTokenizer.from_file(BUNDLED_WORLD_VOCAB).warm_up()


@pytest.fixture(scope="module")
def json_text(world: WorldTokenizer) -> str:
    return world_tokenizer_json(world)


@pytest.fixture(scope="module")
def hf(json_text: str) -> Tokenizer:
    return Tokenizer.from_str(json_text)


@pytest.fixture(scope="module")
def hf_bytes(json_text: str) -> Tokenizer:
    return Tokenizer.from_str(raw_bytes_tokenizer_json(json_text))


@pytest.fixture(scope="module")
def corpus(world: WorldTokenizer) -> list[bytes]:
    # test_tokenizer_world.py's corpus: hand-picked cases, random bytes and code points, token mixes.
    return build_corpus(world.id_to_bytes, seed=7, random_bytes=150, random_unicode=150, token_mixes=400)


def ids_of(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def test_byte_level_alphabet_is_the_tokenizers_one() -> None:
    table = byte_to_unicode()
    assert len(set(table)) == 256
    from tokenizers.pre_tokenizers import ByteLevel

    assert set(table) == set(ByteLevel.alphabet())
    # The pre-tokenizer spells each UTF-8 byte as its character, in order.
    text = "aé\n你\x00 "
    pieces = ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(text)
    assert "".join(p for p, _ in pieces) == byte_level_text(text.encode("utf-8"))


def test_known_answer(hf: Tokenizer) -> None:
    # Published example for this vocab (rwkv-tokenizer README), as in test_tokenizer_world.py.
    text = "Today is a beautiful day. 今天是美好的一天。"
    expected = [33520, 4600, 332, 59219, 21509, 47, 33, 10381, 11639, 13091, 15597, 11685, 14734, 10250, 11639, 10080]
    assert ids_of(hf, text) == expected
    assert hf.decode(expected) == text


def test_text_matches_world(world: WorldTokenizer, hf: Tokenizer, corpus: list[bytes]) -> None:
    texts = [s.decode("utf-8") for s in corpus if is_utf8(s)]
    assert len(texts) > 250
    for text in texts:
        ids = world.encode(text)
        assert ids_of(hf, text) == ids, text[:80]
        assert hf.decode(ids) == text


def test_bytes_match_world(world: WorldTokenizer, hf_bytes: Tokenizer, corpus: list[bytes]) -> None:
    invalid = [s for s in corpus if not is_utf8(s)]
    assert len(invalid) > 150  # the random bytes and the hand-picked invalid UTF-8
    for data in corpus:
        ids = world.encode(data)
        assert ids_of(hf_bytes, byte_level_text(data)) == ids, data[:80]
        # Replacement of invalid UTF-8: Rust's from_utf8_lossy and Python's errors="replace".
        assert hf_bytes.decode(ids) == world.decode_text(ids), data[:80]


def test_empty_and_long_runs(world: WorldTokenizer, hf: Tokenizer) -> None:
    assert ids_of(hf, "") == [] and hf.decode([]) == ""
    rng = random.Random(5)
    runs = ["a" * 10_000, " " * 5_000, "\n" * 4_000, "你" * 3_000, "=" * 1_001, "ab" * 2_000]
    runs.append("".join(rng.choice("ab \n") for _ in range(20_000)))
    for text in runs:
        assert ids_of(hf, text) == world.encode(text), text[:20]


def test_every_token_alone_is_its_id_even_through_merges(world: WorldTokenizer, json_text: str) -> None:
    # With ignore_merges off, `tokenizers` runs BPE over each piece (a whole token), as
    # swift-transformers always does: the merges must close every token onto itself.
    spec = json.loads(raw_bytes_tokenizer_json(json_text))
    spec["model"]["ignore_merges"] = False
    merging = Tokenizer.from_str(json.dumps(spec))
    ids = list(world.id_to_bytes)
    texts = [byte_level_text(world.id_to_bytes[i]) for i in ids]
    got = [e.ids for e in merging.encode_batch(texts, add_special_tokens=False)]
    assert got == [[i] for i in ids]


def test_merge_helpers_sit_above_the_model_vocab(world: WorldTokenizer, json_text: str) -> None:
    vocab = json.loads(json_text)["model"]["vocab"]
    by_id = {i: t for t, i in vocab.items()}
    assert len(by_id) == len(vocab)  # no id twice
    table = byte_to_unicode()
    for token_id, token in world.id_to_bytes.items():
        assert by_id[token_id] == "".join(table[b] for b in token)
    assert by_id[0] == END_OF_TEXT
    helpers = set(by_id) - set(world.id_to_bytes) - {0}
    assert helpers and min(helpers) == 65536  # World models' embedding: 65536 rows
    assert Tokenizer.from_str(world_tokenizer_json(world, model_vocab_size=70_000)).id_to_token(70_000) is not None
    with pytest.raises(ValueError, match="smaller than the vocab"):
        world_tokenizer_json(world, model_vocab_size=1000)


def test_end_of_text_is_id_zero(world: WorldTokenizer, hf: Tokenizer) -> None:
    assert hf.token_to_id(END_OF_TEXT) == 0
    assert hf.decode([0, 33], skip_special_tokens=False) == END_OF_TEXT + " "
    assert hf.decode([0, 33]) == " "
    text = f"x{END_OF_TEXT}y"
    assert ids_of(hf, text) == [121, 0, 122]  # a special token's spelling in text, as in HF's RWKV tokenizers
    raw = Tokenizer.from_str(hf.to_str())
    raw.encode_special_tokens = True
    assert ids_of(raw, text) == world.encode(text)


def test_small_vocab_with_regex_syntax_bytes(tmp_path) -> None:
    # Tokens made of regex syntax characters, and greedy-is-not-optimal: "abc" + "d" + "e".
    table = {b + 1: bytes((b,)) for b in range(256)}
    extra = [b"ab", b"abc", b"cde", b"abcdx", b"-]", b"[^", b"\\\\", b"a-z", b"(?:", b"|)", b"{1}", b".*"]
    table.update((300 + i, t) for i, t in enumerate(extra))
    tok = WorldTokenizer(table)
    hf = Tokenizer.from_str(world_tokenizer_json(tok))
    rng = random.Random(11)
    alphabet = "abcdexz-]^[\\(?:|){}1.*"
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert ids_of(hf, text) == tok.encode(text), text
    assert ids_of(hf, "abcde") == [301, ord("d") + 1, ord("e") + 1]
