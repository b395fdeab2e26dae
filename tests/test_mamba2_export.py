"""Mamba-2 bundles on the Core AI runtime: parity with transformers, the IR contract, the CLI,
and the Hugging Face tokenizer.json passthrough."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

from ir_checks import graph_texts, writes_per_state
from mamba2_files import Geometry, transformers_logits, write_transformers_folder
from ssmport.cli.main import main
from ssmport.exporter.convert import convert
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.runtime import Runner
from ssmport.loader.resolve import load_checkpoint

TOKENS = [1, 5, 77, 3, 3, 150, 9, 0, 12, 44, 44, 101, 7, 2, 159, 30]
GEOMETRY = Geometry(vocab=320)  # H4 P32 N24, 2 groups; room for the test tokenizer's ids
TEXTS = ["The capital of France is Paris.", "def add(a, b):\n    return a + b\n", "state space models decode"]


def build_tokenizer_json(path):
    """A small real byte-level BPE tokenizer.json, trained here (no downloads)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(TEXTS * 20, trainer)
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    f = write_transformers_folder(tmp_path_factory.mktemp("m2x") / "mamba2-groups2", GEOMETRY, seed=21, tied=False)
    build_tokenizer_json(f / "tokenizer.json")
    return f


@pytest.fixture(scope="module")
def fp32_bundle(folder, tmp_path_factory, export_fn):
    return export_fn(folder, tmp_path_factory.mktemp("m2b"), quant="fp32", gate_steps=6)


def coreai_logits(path, tokens):
    with Runner(path) as runner:
        return runner.step_each(tokens)


def test_fp32_bundle_matches_transformers(fp32_bundle, folder):
    assert fp32_bundle.manifest.gate.passed
    ours = coreai_logits(fp32_bundle.path, TOKENS)
    theirs = transformers_logits(folder, TOKENS).numpy()
    assert np.abs(ours - theirs).max() <= 2e-3
    assert np.abs(ours - theirs).max() <= 1e-4 * np.abs(theirs).max()
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


def test_fp16_bundle_matches_transformers_within_its_gate(folder, tmp_path, export_fn):
    result = export_fn(folder, tmp_path, quant="fp16", gate_steps=4)
    assert result.manifest.gate.passed and result.manifest.main.outputs[0].dtype == "float16"
    ours = coreai_logits(result.path, TOKENS)
    theirs = transformers_logits(folder, TOKENS).numpy()
    rel = np.abs(ours - theirs).max() / np.abs(theirs).max()
    assert 1e-5 < rel < get_recipe("fp16").gate.max_rel_logit_delta


def test_contract_names_order_shapes(fp32_bundle):
    g, m = GEOMETRY, fp32_bundle.manifest
    assert [(t.name, list(t.shape), t.dtype) for t in m.states] == [
        ("convState", [g.layers, 1, g.conv, g.conv_dim], "float32"),
        ("ssmState", [g.layers, 1, g.heads, g.head_dim, g.state], "float32"),
    ]
    assert [t.name for t in m.main.inputs] == ["input_ids", "position_ids"]
    assert [(t.name, list(t.shape)) for t in m.main.outputs] == [("logits", [1, 1, g.vocab])]
    with Runner(fp32_bundle.path) as runner:
        assert list(runner._fn.desc.state_names) == ["convState", "ssmState"]
        runner.feed(TOKENS[:3])
        assert runner.state("convState").any() and runner.state("ssmState").any()


@pytest.mark.parametrize("quant, groups", [("fp32", 2), ("int8keepproj", 2), ("fp32", 1)])
def test_each_state_written_once_in_ir(folder, tmp_path, quant, groups):
    """One write per state handle in both functions (decode and prefill), outside any loop.
    One group (the released models) is a separate case: all heads then share B and C."""
    if groups != GEOMETRY.groups:
        folder = write_transformers_folder(tmp_path / "g", replace(GEOMETRY, groups=groups), seed=3, tied=False)
    model = load_checkpoint(folder)
    builder = WeightBuilder(get_recipe(quant), model.architecture.keeps_float)
    converted = convert(model, builder, torch.float32, prefill_chunk=4)
    program = converted.program
    assert converted.decode.writes_per_state == {"convState": 1, "ssmState": 1}
    assert list(graph_texts(program)) == ["main", "prefill"]
    for function in ("main", "prefill"):
        assert writes_per_state(program, function, top_level_only=True) == {"convState": 1, "ssmState": 1}
        assert writes_per_state(program, function) == {"convState": 1, "ssmState": 1}
    # Prefill runs the SSM in its chunkwise (SSD) form: matmuls over the chunk, no in-graph loop.
    assert not any("coreai.while" in text for text in graph_texts(program).values())


def test_tokenizer_json_passthrough_and_cli(fp32_bundle, folder, capsys, tmp_path):
    from tokenizers import Tokenizer

    tok = fp32_bundle.manifest.tokenizer
    copied = fp32_bundle.path / tok.path
    assert tok.kind == "hf-json" and tok.origin == "next to checkpoint"
    assert copied.read_bytes() == (folder / "tokenizer.json").read_bytes()
    assert tok.sha256 == hashlib.sha256(copied.read_bytes()).hexdigest()
    library = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert tok.entries == library.get_vocab_size()

    assert main(["tokenize", str(fp32_bundle.path), "--text", TEXTS[0], "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == library.encode(TEXTS[0]).ids
    assert main(["generate", str(fp32_bundle.path), "--prompt", "The capital", "-n", "6"]) == 0
    assert capsys.readouterr().out.startswith("The capital")
    assert main(["gate", str(fp32_bundle.path), "--text", TEXTS[1], "--json"]) == 0
    assert '"passed": true' in capsys.readouterr().out
    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(map(str, TOKENS)))
    assert main(["logits", str(fp32_bundle.path), "--tokens-file", str(ids), "--out", str(tmp_path / "l.npy")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "l.npy"), coreai_logits(fp32_bundle.path, TOKENS), atol=1e-6)


def test_stream_decoding_equals_one_shot(folder):
    from ssmport.tokenizers import load_tokenizer

    tok = load_tokenizer(folder / "tokenizer.json")
    ids = tok.encode("héllo wörld, 你好 state space")
    stream = tok.stream()
    assert "".join(stream.feed(i) for i in ids) + stream.flush() == tok.decode_text(ids) == "héllo wörld, 你好 state space"
    assert tok.eos_ids == (0,)


def test_missing_tokenizers_package_is_one_line(fp32_bundle):
    code = ("import sys; sys.modules['tokenizers'] = None\n"
            "from ssmport.cli.main import main\n"
            f"sys.exit(main(['generate', {str(fp32_bundle.path)!r}, '--prompt', 'hi']))")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"ssmport: error: {fp32_bundle.path / 'tokenizer' / 'tokenizer.json'}: reading tokenizer.json needs "
        "the `tokenizers` package: pip install 'ssmport[hf]'"
    ]


def test_synthetic_preset_exports(tmp_path, export_fn):
    result = export_fn("mamba2-tiny", tmp_path, gate_steps=6)
    assert result.manifest.gate.passed and result.manifest.synthetic_weights


def test_broken_folder_cli_is_one_line_and_leaves_nothing(folder, tmp_path, capsys):
    import shutil

    broken = shutil.copytree(folder, tmp_path / "broken")
    cfg = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps(cfg | {"state_size": 16}))
    out = tmp_path / "out"
    assert main(["export", str(broken), "-o", str(out), "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "misshaped" in err[0]
    assert not out.exists() or list(out.iterdir()) == []
