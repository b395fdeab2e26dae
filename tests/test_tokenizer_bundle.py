"""The tokenizer inside bundles and on the command line."""

from __future__ import annotations

import base64
import hashlib
import json
import importlib.resources
import shutil
from pathlib import Path

import pytest

from ssmport.cli.main import main
from ssmport.errors import SsmportError
from ssmport.tokenizers import BUNDLED_WORLD_VOCAB, WorldTokenizer


def small_vocab(path: Path, n: int = 300) -> Path:
    """A handcrafted World-format vocab: all 256 bytes plus a few merged tokens."""
    lines = [f"{i + 1} {bytes([i])!r} 1" for i in range(256)]
    words = ["th", "the", "he", " t", "in", "ing", "an", "and", " a", "er"]
    lines += [f"{257 + k} {w!r} {len(w)}" for k, w in enumerate(words[: n - 256])]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_bundled_vocab_is_the_rwkv_package_file():
    theirs = Path(str(importlib.resources.files("rwkv") / "rwkv_vocab_v20230424.txt"))
    assert hashlib.sha256(BUNDLED_WORLD_VOCAB.read_bytes()).digest() == hashlib.sha256(theirs.read_bytes()).digest()


def test_tiny_default_bundle_carries_world_tokenizer(tmp_path, export_fn, capsys):
    result = export_fn("rwkv7-tiny", tmp_path, gate=False)
    tok = result.manifest.tokenizer
    tsv = result.path / tok.path
    assert tok.entries == 65529 and tok.origin.startswith("bundled")
    assert hashlib.sha256(tsv.read_bytes()).hexdigest() == tok.sha256
    world = WorldTokenizer.from_file(BUNDLED_WORLD_VOCAB)
    assert tok.sha256 == world.fingerprint()
    first = tsv.read_text().split("\n", 1)[0].split("\t")
    assert int(first[0]) == 1 and base64.b64decode(first[1]) == world.decode([1])

    assert main(["generate", str(result.path), "--prompt", "Hello", "-n", "4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Hello") and len(out) > len("Hello\n")
    assert main(["tokenize", str(result.path), "--text", "Hello world", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == world.encode("Hello world")
    assert main(["gate", str(result.path), "--text", "The quick brown fox", "--json"]) == 0
    assert '"passed": true' in capsys.readouterr().out


def test_vocab_next_to_hf_folder_is_used(fla_folder, tmp_path, export_fn):
    folder = shutil.copytree(fla_folder, tmp_path / "with-vocab")
    small_vocab(folder / "rwkv_vocab_v20230424.txt", 266)
    result = export_fn(folder, tmp_path / "out", quant="fp32", gate=False)
    tok = result.manifest.tokenizer
    assert tok.origin == "next to checkpoint" and tok.entries == 266


def test_vocab_larger_than_embedding_is_refused(blinkdl_pth, tmp_path, export_fn):
    with pytest.raises(SsmportError, match="beyond the model's 320-row embedding"):
        export_fn(blinkdl_pth, tmp_path, quant="fp32", gate=False, vocab=BUNDLED_WORLD_VOCAB)
    assert not any(tmp_path.iterdir())


def test_unfitting_vocab_next_to_checkpoint_is_left_out(fla_folder, tmp_path, export_fn):
    folder = shutil.copytree(fla_folder, tmp_path / "big-vocab")
    shutil.copy(BUNDLED_WORLD_VOCAB, folder / "rwkv_vocab_v20230424.txt")
    result = export_fn(folder, tmp_path / "out", quant="fp32", gate=False)
    assert result.manifest.tokenizer is None
    assert "320-row embedding; the bundle gets no tokenizer" in result.manifest.notes[0]


def test_small_models_without_vocab_have_no_tokenizer(pth_fp32_bundle, capsys):
    assert pth_fp32_bundle.manifest.tokenizer is None
    assert main(["generate", str(pth_fp32_bundle.path), "--prompt", "hi"]) == 2
    assert "has no tokenizer" in capsys.readouterr().err


def test_tokenizer_export_cli_verifies(tmp_path, capsys):
    out = tmp_path / "vocab.tsv"
    assert main(["tokenizer", "export", str(BUNDLED_WORLD_VOCAB), "-o", str(out)]) == 0
    assert "65529 entries" in capsys.readouterr().out
    assert WorldTokenizer.from_file(out).fingerprint() == hashlib.sha256(out.read_bytes()).hexdigest()
    bad = tmp_path / "bad.txt"
    bad.write_text("1 'a' 2\n")
    assert main(["tokenizer", "export", str(bad), "-o", str(tmp_path / "x.tsv")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ssmport: error:") and "bad.txt:1" in err and not (tmp_path / "x.tsv").exists()
