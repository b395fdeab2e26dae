"""RWKV World tokenizer: id-exact agreement with the reference, vocab files, vocab.tsv export.

The independent reference is ``rwkv.rwkv_tokenizer.TRIE_TOKENIZER`` from the
``rwkv`` PyPI package (test dependency), loaded from the vocab file that
package ships.  ``rwkv/__init__.py`` is empty, so importing the tokenizer
module does not pull in torch (checked below).
"""

from __future__ import annotations

import hashlib
import importlib.resources
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rwkv.rwkv_tokenizer import TRIE_TOKENIZER

import ssmport.tokenizers.world as world_module
from ssmport.errors import SsmportError
from ssmport.tokenizers import (
    TokenizerError,
    VocabError,
    VocabVerificationError,
    WorldTokenizer,
    build_corpus,
    export_vocab_tsv,
    find_vocab,
    load_vocab,
    verify_vocab_tsv,
)
from ssmport.tokenizers.corpus import is_utf8

# sha256 of the canonical vocab.tsv of rwkv_vocab_v20230424.txt: pins both the
# table and the serialization format that manifests record.
WORLD_FINGERPRINT = "7ab0620fec357a5c418c84793b92ce3c7bf860d397e6334bfe62865340e0b377"


@pytest.fixture(scope="module")
def vocab_path() -> Path:
    path = Path(str(importlib.resources.files("rwkv") / "rwkv_vocab_v20230424.txt"))
    assert path.is_file(), path
    return path


@pytest.fixture(scope="module")
def reference(vocab_path: Path) -> TRIE_TOKENIZER:
    return TRIE_TOKENIZER(str(vocab_path))


@pytest.fixture(scope="module")
def world(vocab_path: Path) -> WorldTokenizer:
    return WorldTokenizer.from_file(vocab_path).warm_up()


@pytest.fixture(scope="module")
def corpus(world: WorldTokenizer) -> list[bytes]:
    return build_corpus(world.id_to_bytes, seed=7, random_bytes=150, random_unicode=150, token_mixes=400)


@pytest.fixture(scope="module")
def exported(world: WorldTokenizer, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    path = tmp_path_factory.mktemp("export") / "vocab.tsv"
    export_vocab_tsv(world, path)
    return path, path.read_bytes()


def write_txt_vocab(path: Path, entries: list[tuple[int, str | bytes]], newline: str = "\n") -> Path:
    """Write a vocab in the original format, declaring the true byte length."""
    lines = []
    for token_id, token in entries:
        size = len(token.encode("utf-8") if isinstance(token, str) else token)
        lines.append(f"{token_id} {token!r} {size}")
    path.write_bytes((newline.join(lines) + newline).encode("utf-8"))
    return path


def byte_entries(skip: bytes = b"") -> list[tuple[int, str | bytes]]:
    """All single bytes as ids 1..256 (like the World vocab: str for ASCII, bytes above)."""
    return [
        (b + 1, chr(b) if b < 128 else bytes((b,)))
        for b in range(256)
        if bytes((b,)) not in skip
    ]


# -- the reference and the real vocab ---------------------------------------------


def test_reference_import_does_not_pull_in_torch() -> None:
    code = "import sys, rwkv.rwkv_tokenizer; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_world_vocab_facts(world: WorldTokenizer) -> None:
    table = world.id_to_bytes
    assert len(table) == 65529
    assert min(table) == 1 and max(table) == 65529
    assert world.vocab_size == 65530
    assert 0 not in table
    assert world.max_token_length == 128
    assert all(world.token_to_id(bytes((b,))) is not None for b in range(256))
    assert world.fingerprint() == WORLD_FINGERPRINT


def test_known_answer(world: WorldTokenizer) -> None:
    # Published example for this vocab (rwkv-tokenizer README), independent of both implementations.
    text = "Today is a beautiful day. 今天是美好的一天。"
    expected = [33520, 4600, 332, 59219, 21509, 47, 33, 10381, 11639, 13091, 15597, 11685, 14734, 10250, 11639, 10080]
    assert world.encode(text) == expected
    assert world.decode_text(expected) == text


# -- id-exact agreement with the reference ---------------------------------------------


def test_matches_reference_on_corpus(world: WorldTokenizer, reference: TRIE_TOKENIZER, corpus: list[bytes]) -> None:
    assert len(corpus) > 700
    for sample in corpus:
        assert world.encode(sample) == reference.encodeBytes(sample), sample[:80]


def test_matches_reference_on_str_input(world: WorldTokenizer, reference: TRIE_TOKENIZER, corpus: list[bytes]) -> None:
    texts = [s.decode("utf-8") for s in corpus if is_utf8(s)]
    assert len(texts) > 100
    for text in texts:
        assert world.encode(text) == reference.encode(text), text[:80]


def test_matches_reference_across_internal_windows(
    world: WorldTokenizer, reference: TRIE_TOKENIZER, corpus: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Force many small matching windows (4 * max_token_length bytes) so tokens
    # straddle window ends everywhere.
    monkeypatch.setattr(world_module, "_CHUNK_BYTES", 1)
    data = b"".join(corpus)
    assert len(data) > 100 * 4 * world.max_token_length
    assert world.encode(data) == reference.encodeBytes(data)


def test_window_boundaries_with_max_length_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tokens "a" * 2..8: every window end cuts some maximal-length match, at every shift.
    entries = byte_entries() + [(300 + k, "a" * k) for k in range(2, 9)]
    path = write_txt_vocab(tmp_path / "v.txt", entries)
    ours, ref = WorldTokenizer.from_file(path), TRIE_TOKENIZER(str(path))
    monkeypatch.setattr(world_module, "_CHUNK_BYTES", 1)  # windows of 4 * 8 bytes
    for shift in range(40):
        for run in (7, 8, 9, 31, 32, 33, 200):
            text = "b" * shift + "a" * run + "b" + "a" * (run // 2)
            assert ours.encode(text) == ref.encode(text), (shift, run)


def test_empty_and_input_types(world: WorldTokenizer) -> None:
    assert world.encode("") == [] and world.encode(b"") == []
    assert world.decode([]) == b"" and world.decode_text([]) == ""
    ids = world.encode("héllo")
    assert world.encode(b"h\xc3\xa9llo") == ids == world.encode(bytearray(b"h\xc3\xa9llo"))
    with pytest.raises(TypeError):
        world.encode(123)  # type: ignore[arg-type]


def test_greedy_longest_match_not_optimal(tmp_path: Path) -> None:
    # "abcde": greedy takes "abc" then "d", "e" (3 tokens), although "ab"+"cde" is 2.
    entries = byte_entries() + [(300, "ab"), (301, "abc"), (302, "cde"), (303, "abcdx")]
    path = write_txt_vocab(tmp_path / "v.txt", entries)
    ours, ref = WorldTokenizer.from_file(path), TRIE_TOKENIZER(str(path))
    expected = [301, ord("d") + 1, ord("e") + 1]
    assert ours.encode("abcde") == ref.encode("abcde") == expected
    # The walk reaches "abcd" (a prefix of "abcdx", not a token) and falls back to "abc".
    assert ours.encode("abcdy") == ref.encode("abcdy") == [301, ord("d") + 1, ord("y") + 1]


def test_matches_reference_on_handcrafted_vocab(tmp_path: Path) -> None:
    # Small alphabet + many overlapping tokens: lots of dead ends and back-offs.
    rng = random.Random(3)
    extra = sorted({"".join(rng.choice("abc") for _ in range(rng.randint(2, 9))) for _ in range(120)})
    entries = byte_entries() + [(1000 + i, t) for i, t in enumerate(extra)]
    path = write_txt_vocab(tmp_path / "v.txt", entries)
    ours, ref = WorldTokenizer.from_file(path), TRIE_TOKENIZER(str(path))
    for _ in range(300):
        text = "".join(rng.choice("abcd") for _ in range(rng.randint(0, 60)))
        assert ours.encode(text) == ref.encode(text), text


def test_missing_byte_is_a_clear_error(tmp_path: Path) -> None:
    path = write_txt_vocab(tmp_path / "v.txt", byte_entries(skip=b"z") + [(400, "zz")])
    tok = WorldTokenizer.from_file(path)
    assert tok.encode("zz") == [400]
    with pytest.raises(TokenizerError, match=r"byte 0x7a at offset 5"):
        tok.encode("abczzz")  # "zz" at offset 3, then a lone "z" at offset 5
    # The reference cannot encode it either (it fails with an UnboundLocalError).
    with pytest.raises(Exception):
        TRIE_TOKENIZER(str(path)).encode("abczzz")


# -- decoding -------------------------------------------------------------------------


def test_round_trip(world: WorldTokenizer, reference: TRIE_TOKENIZER, corpus: list[bytes]) -> None:
    for sample in corpus:
        ids = world.encode(sample)
        assert world.decode(ids) == sample == reference.decodeBytes(ids)
        assert world.decode_text(ids) == sample.decode("utf-8", errors="replace")


def test_unknown_id_is_a_clear_error(world: WorldTokenizer) -> None:
    for bad in ([0], [33, 65530], [33, -1], [None]):
        with pytest.raises(TokenizerError, match="unknown token id"):
            world.decode(bad)  # type: ignore[arg-type]
        with pytest.raises(TokenizerError, match="unknown token id"):
            world.decode_text(bad)  # type: ignore[arg-type]
    with pytest.raises(TokenizerError, match=r"unknown token id 0 at position 1"):
        world.decode([33, 0])


def _stream(world: WorldTokenizer, ids: list[int]) -> tuple[list[str], str]:
    dec = world.stream()
    pieces = [dec.feed(i) for i in ids]
    return pieces, dec.flush()


def test_stream_decoder_splits_multibyte_characters(world: WorldTokenizer) -> None:
    def one(byte: int) -> int:
        return world.token_to_id(bytes((byte,)))

    ni_hao = "你好".encode("utf-8")  # e4 bd a0 e5 a5 bd
    pieces, tail = _stream(world, [one(b) for b in ni_hao])
    assert pieces == ["", "", "你", "", "", "好"] and tail == ""
    # 4-byte emoji split 1 + 3, with ASCII around it
    emoji = "😀".encode("utf-8")
    ids = [world.token_to_id(b"a"), one(emoji[0]), one(emoji[1]), one(emoji[2]), one(emoji[3]), world.token_to_id(b"b")]
    pieces, tail = _stream(world, ids)
    assert pieces == ["a", "", "", "", "😀", "b"] and tail == ""
    # Truncated at the end: held back until flush, then one U+FFFD, like decode_text.
    pieces, tail = _stream(world, [one(0xE4), one(0xBD)])
    assert pieces == ["", ""] and tail == "\ufffd" == world.decode_text([one(0xE4), one(0xBD)])
    # An invalid continuation is reported as soon as it is known.
    pieces, tail = _stream(world, [one(0xE4), world.token_to_id(b"x")])
    assert "".join(pieces) == "\ufffdx" and tail == ""


def test_stream_decoder_equals_full_decode(world: WorldTokenizer, corpus: list[bytes]) -> None:
    rng = random.Random(11)
    single = [world.token_to_id(bytes((b,))) for b in range(256)]
    sequences = [world.encode(s) for s in corpus]
    # Random bytes fed one byte-token at a time: every split and invalid form.
    sequences += [[single[b] for b in rng.randbytes(rng.randint(1, 64))] for _ in range(300)]
    # Random mixes of any ids.
    all_ids = list(world.id_to_bytes)
    sequences += [[rng.choice(all_ids) for _ in range(rng.randint(1, 40))] for _ in range(300)]
    dec = world.stream()  # reused: flush() resets it
    for ids in sequences:
        text = "".join(dec.feed(i) for i in ids) + dec.flush()
        assert text == world.decode_text(ids), ids
        assert dec.pending == b""


def test_stream_decoder_unknown_id_keeps_state(world: WorldTokenizer) -> None:
    dec = world.stream()
    assert dec.feed(world.token_to_id(b"\xe4")) == ""
    with pytest.raises(TokenizerError, match="unknown token id 0"):
        dec.feed(0)
    assert dec.pending == b"\xe4"
    assert dec.feed(world.token_to_id(b"\xbd")) == "" and dec.feed(world.token_to_id(b"\xa0")) == "你"


# -- vocab file parsing -----------------------------------------------------------------


def test_crlf_and_lf_give_the_same_table(vocab_path: Path, tmp_path: Path, world: WorldTokenizer) -> None:
    # (The copy shipped in the rwkv package happens to use CRLF.)
    lf_data = vocab_path.read_bytes().replace(b"\r\n", b"\n")
    assert b"\r" not in lf_data
    (tmp_path / "lf.txt").write_bytes(lf_data)
    (tmp_path / "crlf.txt").write_bytes(lf_data.replace(b"\n", b"\r\n"))
    for name in ("lf.txt", "crlf.txt"):
        assert WorldTokenizer.from_file(tmp_path / name).id_to_bytes == world.id_to_bytes
    small = [(1, "a"), (2, " \\x"), (3, b"\xff"), (4, "你")]
    assert load_vocab(write_txt_vocab(tmp_path / "small_lf.txt", small)) == load_vocab(
        write_txt_vocab(tmp_path / "crlf2.txt", small, newline="\r\n")
    ) == {1: b"a", 2: b" \\x", 3: b"\xff", 4: "你".encode()}


def test_literal_tokens_with_spaces_and_quotes(tmp_path: Path) -> None:
    entries = [(1, " "), (2, "a b "), (3, "'"), (4, '"'), (5, b" \x00 "), (6, "1 2")]
    table = load_vocab(write_txt_vocab(tmp_path / "v.txt", entries))
    assert table == {i: (t.encode() if isinstance(t, str) else t) for i, t in entries}


@pytest.mark.parametrize(
    ("lines", "bad_line", "message"),
    [
        (["1 'a' 1", "2 'bc' 3"], 2, "is 2 bytes but the line declares 3"),
        (["1 'a' 1", "2 '你' 1"], 2, "is 3 bytes but the line declares 1"),
        (["1 'a' 1", "2 'b 1"], 2, "bad token literal"),
        (["1 'a' 1", "2 __import__('os').system('false') 1"], 2, "bad token literal"),
        (["1 'a' 1", "2 123 3"], 2, "must be a str or bytes literal"),
        (["1 'a' 1", "2 ['b'] 1"], 2, "must be a str or bytes literal"),
        (["1 'a' 1", "1 'b' 1"], 2, "duplicate token id 1 (first defined on line 1)"),
        (["1 'a' 1", "2 b'a' 1"], 2, "duplicate token bytes"),
        (["1 'a' 1", "2 '' 0"], 2, "empty byte string"),
        (["1 'a' 1", "x 'b' 1"], 2, "expected '<id> <str or bytes literal> <byte length>'"),
        (["1 'a' 1", "2 'b'"], 2, "expected '<id>"),
        (["1 'a' 1", "2 '\\ud800' 3"], 2, "cannot be encoded as UTF-8"),
    ],
)
def test_vocab_errors_name_file_and_line(tmp_path: Path, lines: list[str], bad_line: int, message: str) -> None:
    for newline in ("\n", "\r\n"):
        path = tmp_path / "bad_vocab.txt"
        path.write_bytes(newline.join(lines).encode() + newline.encode())
        with pytest.raises(VocabError) as info:
            WorldTokenizer.from_file(path)
        text = str(info.value)
        assert text.startswith(f"{path}:{bad_line}: "), text
        assert message in text and "\n" not in text
        assert isinstance(info.value, ValueError) and info.value.line == bad_line


def test_vocab_file_level_errors(tmp_path: Path) -> None:
    cases = {
        "empty.txt": b"",
        "blank.txt": b"\n\n",
        "prose.txt": b"hello world\n",
        "latin1.txt": b"1 'a' 1\n2 '\xe9' 1\n",
    }
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(VocabError, match=f"^{re.escape(str(path))}"):
            WorldTokenizer.from_file(path)
    with pytest.raises(VocabError, match="cannot read vocab file"):
        WorldTokenizer.from_file(tmp_path / "missing.txt")
    with pytest.raises(VocabError, match=r"latin1.txt:2: line is not valid UTF-8"):
        WorldTokenizer.from_file(tmp_path / "latin1.txt")


def test_find_vocab(tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    assert find_vocab(hf) is None
    (hf / "vocab.tsv").write_text("1\tYQ==\n")
    assert find_vocab(hf) == hf / "vocab.tsv"
    (hf / "rwkv_vocab_v20230424.txt").write_text("1 'a' 1\n")
    assert find_vocab(hf) == hf / "rwkv_vocab_v20230424.txt"
    assert find_vocab(hf / "config.json") == hf / "rwkv_vocab_v20230424.txt"
    pth_dir = tmp_path / "pth"
    pth_dir.mkdir()
    (pth_dir / "RWKV-x070-World-0.1B.pth").write_bytes(b"")
    (pth_dir / "rwkv_vocab_v20250101.txt").write_text("1 'a' 1\n")
    assert find_vocab(pth_dir / "RWKV-x070-World-0.1B.pth") == pth_dir / "rwkv_vocab_v20250101.txt"
    assert find_vocab(pth_dir / "rwkv_vocab_v20250101.txt") == pth_dir / "rwkv_vocab_v20250101.txt"
    assert find_vocab(tmp_path / "nope") is None
    assert WorldTokenizer.from_file(hf).id_to_bytes == {1: b"a"}


# -- vocab.tsv export and verification ---------------------------------------------------


def test_export_round_trip(world: WorldTokenizer, exported: tuple[Path, bytes], vocab_path: Path, tmp_path: Path) -> None:
    path, data = exported
    assert b"\r" not in data and data.endswith(b"\n")
    lines = data.split(b"\n")[:-1]
    assert len(lines) == 65529 and lines[0] == b"1\tAA==" and lines[32] == b"33\tIA=="
    assert hashlib.sha256(data).hexdigest() == world.fingerprint() == WORLD_FINGERPRINT
    from_tsv = WorldTokenizer.from_file(path)
    assert from_tsv.id_to_bytes == world.id_to_bytes and from_tsv.fingerprint() == world.fingerprint()
    # Export straight from the original vocab file path gives the same file and info.
    info = export_vocab_tsv(vocab_path, tmp_path / "again.tsv")
    assert (info.entries, info.sha256, info.size_bytes) == (65529, WORLD_FINGERPRINT, len(data))
    assert (tmp_path / "again.tsv").read_bytes() == data
    assert verify_vocab_tsv(path, world).sha256 == WORLD_FINGERPRINT
    assert [p.name for p in tmp_path.iterdir()] == ["again.tsv"]  # no temp files left


def test_from_file_detects_format_by_content(exported: tuple[Path, bytes], vocab_path: Path, tmp_path: Path) -> None:
    tsv_named_txt = tmp_path / "rwkv_vocab_v20230424.txt"
    tsv_named_txt.write_bytes(exported[1])
    txt_named_tsv = tmp_path / "vocab.tsv"
    txt_named_tsv.write_bytes(vocab_path.read_bytes())
    a, b = WorldTokenizer.from_file(tsv_named_txt), WorldTokenizer.from_file(txt_named_tsv)
    assert a.fingerprint() == b.fingerprint() == WORLD_FINGERPRINT


def _flip_base64_char(data: bytes) -> bytes:
    lines = data.split(b"\n")
    token_id, b64 = lines[1000].split(b"\t")
    swapped = b"B" if b64[:1] != b"B" else b"C"
    lines[1000] = token_id + b"\t" + swapped + b64[1:]
    return b"\n".join(lines)


def _drop_line(data: bytes, token_id: int) -> bytes:
    lines = data.split(b"\n")
    del lines[next(i for i, line in enumerate(lines) if line.startswith(b"%d\t" % token_id))]
    return b"\n".join(lines)


def _flip_padding_bits(data: bytes) -> bytes:
    # "AA==" -> "AB==" decodes to the same byte (the bits are ignored) but is not canonical.
    assert data.startswith(b"1\tAA==\n")
    return data.replace(b"1\tAA==\n", b"1\tAB==\n", 1)


CORRUPTIONS = {
    "flipped base64 char": (_flip_base64_char, 1001, "token id 1001 is"),
    "non-canonical base64": (_flip_padding_bits, 1, "non-canonical base64"),
    "invalid base64 char": (lambda d: d.replace(b"2\tAQ==", b"2\tA!==", 1), 2, "expected '<id>\\t<base64 bytes>'"),
    "missing line": (lambda d: _drop_line(d, 500), 500, "token id 500 is missing"),
    "wrong id": (lambda d: d.replace(b"\n700\t", b"\n70000\t", 1), 701, "out of order"),
    "wrong last id": (lambda d: d.replace(b"\n65529\t", b"\n65531\t", 1), 65529, "token id 65529 is missing"),
    "id out of order": (lambda d: d.replace(b"\n700\t", b"\n699\t", 1), 700, "out of order"),
    "extra line": (lambda d: d + b"70000\tAA==\n", 65530, "duplicate token bytes"),
    "extra id": (lambda d: d + b"70000\t//79/A==\n", 65530, "unexpected token id 70000"),
    "blank line": (lambda d: d.replace(b"\n300\t", b"\n\n300\t", 1), 300, "differs from the canonical"),
    "crlf": (lambda d: d.replace(b"\n", b"\r\n"), 1, "CR found"),
    "truncated": (lambda d: d[: len(d) // 2], None, "verification failed"),
    "no final newline": (lambda d: d[:-1], 65529, "missing final newline"),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_verify_catches_corruption(world: WorldTokenizer, exported: tuple[Path, bytes], tmp_path: Path, name: str) -> None:
    corrupt, line, message = CORRUPTIONS[name]
    bad = corrupt(exported[1])
    assert bad != exported[1]
    path = tmp_path / "vocab.tsv"
    path.write_bytes(bad)
    with pytest.raises(VocabVerificationError) as info:
        verify_vocab_tsv(path, world)
    text = str(info.value)
    assert message in text and "\n" not in text, text
    prefix = f"{path}:{line}: " if line is not None else f"{path}"
    assert text.startswith(prefix), text


def test_export_is_atomic(world: WorldTokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "vocab.tsv"
    out.write_bytes(b"previous content\n")

    def failing_verify(*args: object, **kwargs: object) -> None:
        raise VocabVerificationError("simulated mismatch", path=out)

    monkeypatch.setattr("ssmport.tokenizers.vocab_tsv._verify", failing_verify)
    with pytest.raises(VocabVerificationError, match="simulated mismatch"):
        export_vocab_tsv(world, out)
    assert out.read_bytes() == b"previous content\n"
    assert sorted(os.listdir(tmp_path)) == ["vocab.tsv"]
    with pytest.raises(SsmportError, match="cannot write"):  # one line, no OSError traceback
        export_vocab_tsv(world, tmp_path / "no_such_dir" / "vocab.tsv")


def test_verify_rejects_a_different_vocab(exported: tuple[Path, bytes], tmp_path: Path) -> None:
    other = WorldTokenizer.from_file(write_txt_vocab(tmp_path / "small.txt", byte_entries()))
    with pytest.raises(VocabVerificationError, match="vocab.tsv verification failed"):
        verify_vocab_tsv(exported[0], other)
