"""`--layout apple`: bundles Apple's engines load and drive, checked on the Core AI runtime.

For each built-in architecture (RWKV-7 on the trained rwkv7-pydoc, Mamba-2, Gated DeltaNet and
RWKV-6 on their tiny presets), with the default one-token `main` (and Mamba-2 with the "chunk" `main` too):
the functions have the signatures the engines accept (docs/apple-engines.md), the states are
three fixed ones, metadata.json and the tokenizer files are there, check-engine says which
engines drive it, the gate passes, and a multi-turn conversation fed exactly as Apple's
sequential engine feeds it (tests/apple_protocol.py, over the real runtime) generates the ids
ssmport's own runner generates.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from apple_protocol import SequentialEngine
from ssmport.apple import describe_directory
from ssmport.apple.description import FunctionDesc, TensorDesc
from ssmport.apple.sources import MAIN_86B363D, PREFILL_GRAPH
from ssmport.bundle import Bundle
from ssmport.cli.main import main as cli
from ssmport.exporter.pipeline import export
from ssmport.manifest import DYNAMIC_DIM
from ssmport.runtime import Runner
from ssmport.loader.resolve import load_model
from ssmport.gate.torch_runner import TorchRunner

STATES = {
    "rwkv7-pydoc": ["recState", "attnShiftState", "ffnShiftState"],
    "mamba2-tiny": ["xConvState", "bcConvState", "ssmState"],
    "gated-deltanet-tiny": ["qkConvState", "vConvState", "recState"],
    "rwkv6-tiny": ["recState", "attnShiftState", "ffnShiftState"],
}


BUNDLES = [(preset, "decode") for preset in STATES] + [("mamba2-tiny", "chunk")]


@pytest.fixture(scope="session", params=BUNDLES, ids=lambda p: f"{p[0]}-{p[1]}")
def apple_bundle(request, tmp_path_factory):
    """The preset in the apple layout with that `main`; the synthetic presets get a small trained
    tokenizer.json (with a tokenizer_config.json beside it): Apple's loader needs one inside the bundle."""
    preset, main_form = request.param
    out = tmp_path_factory.mktemp("apple")
    vocab = None
    if preset != "rwkv7-pydoc":
        from hybrid_files import write_tokenizer

        write_tokenizer(out, 512, "qwen3_5")
        vocab = out / "tokenizer.json"
    result = export(preset, out / "bundles", quant="fp32", layout="apple", gate_steps=6, progress=False,
                    prefill_chunk=8, vocab=vocab, apple_main=main_form)  # fmt: skip
    return preset, main_form, result


def describe(bundle: Bundle):
    m = bundle.manifest

    def tensors(entries):
        return tuple(TensorDesc(t.name, tuple(None if d == DYNAMIC_DIM else d for d in t.shape), t.dtype) for t in entries)

    functions = {"main": FunctionDesc(tensors(m.main.inputs), tensors(m.main.outputs), tensors(m.states))}
    if m.prefill:
        functions["prefill"] = FunctionDesc(tensors(m.prefill.inputs), tensors(m.prefill.outputs), tensors(m.states))
    return describe_directory(bundle.path, functions)


def test_signatures_states_and_files(apple_bundle):
    preset, main_form, result = apple_bundle
    m = result.manifest
    V, T = m.vocab_size, 1 if main_form == "decode" else -1
    assert m.layout == "apple" and result.manifest.gate.passed
    assert [t.key for t in m.main.inputs] == [("input_ids", (1, T), "int32"), ("position_ids", (1, -1), "int32")]
    assert [t.key for t in m.main.outputs] == [("logits", (1, T, V), "float16")]
    assert [t.key for t in m.prefill.inputs] == [("input_ids", (1, -1), "int32"), ("position_ids", (1, -1), "int32")]
    assert m.prefill.outputs == ()
    assert [s.name for s in m.states] == STATES[preset] and {s.kind for s in m.states} == {"fixed"}
    meta = json.loads((result.path / "metadata.json").read_text())
    assert meta["metadata_version"] == "0.2" and meta["assets"]["main"] == "model.aimodel"
    assert meta["language"]["vocab_size"] == V
    assert meta["language"]["states"] == {name: "fixed" for name in STATES[preset]}
    if preset == "rwkv7-pydoc":  # the World-format byte vocab as a tokenizer.json, with its config
        tok = json.loads((result.path / "tokenizer" / "tokenizer_config.json").read_text())
        assert tok["eos_token"] and "chat_template" in tok
        assert (result.path / "tokenizer" / "tokenizer.json").is_file()


def test_check_engine_names_the_engine_that_drives_it(apple_bundle, capsys):
    _, main_form, result = apple_bundle
    assert cli(["check-engine", str(result.path)]) == 0
    out = capsys.readouterr().out
    assert "coreai-sequential @prefill-graph  drives" in out
    assert "pipelined.kv_pair" in out  # and why the default (pipelined) engine cannot
    if main_form == "chunk":
        assert "coreai-sequential @86b363d        drives" in out
    else:  # 86b363d sends whole prompts to `main`
        assert "coreai-sequential @86b363d        cannot drive" in out and "COREAI_CHUNK_THRESHOLD=1" in out


def test_the_native_layout_fails_the_prefill_guard(tmp_path, capsys):
    """The same checks on an ssmport-layout bundle: its prefill (valid_len, logits) is what
    Apple's newer engines refuse."""
    result = export("mamba2-tiny", tmp_path, quant="fp32", gate=False, progress=False, prefill_chunk=8)
    cli(["check-engine", str(result.path)])
    assert "prefill" in capsys.readouterr().out


def test_runner_feeds_like_the_engines_and_matches_the_reference(apple_bundle):
    preset, _, result = apple_bundle
    model = load_model(preset, synthetic=preset != "rwkv7-pydoc")
    tokens = np.random.default_rng(3).integers(1, min(model.config.vocab_size, 257), 21).tolist()
    want = TorchRunner(model).step_each(tokens)
    with Runner(result.path) as runner:
        fed = runner.feed(tokens)  # prefill for all but the last token, main for the last
        runner.reset()
        each = runner.step_each(tokens)
    scale = np.abs(want).max()
    assert np.abs(each - want).max() / scale < 1e-3  # fp16 logits: 2^-11 of a logit at most
    assert np.abs(fed - want[-1]).max() / scale < 1e-3


def test_the_sequential_engine_generates_what_the_runner_generates(apple_bundle):
    """A three-turn conversation as CoreAISequentialEngine feeds it (prompts through `prefill` in
    balanced chunks with the last token held back for `main` at the prefill-graph revision, one
    `main` call at 86b363d, which only the "chunk" main takes; history matching; a full reset on
    divergence) against ssmport's runner, greedy, on the same bundle."""
    preset, main_form, result = apple_bundle
    revisions = (PREFILL_GRAPH,) if main_form == "decode" else (PREFILL_GRAPH, MAIN_86B363D)
    with Runner(result.path) as runner:
        for revision in revisions:
            engine = SequentialEngine(describe(Bundle.open(result.path)), runner, revision=revision,
                                      chunk_threshold=8)  # fmt: skip
            rng = np.random.default_rng(11)
            history: list[int] = []
            for turn, restart in enumerate((False, False, True)):
                if restart:  # a new conversation: the engine's history diverges, it resets fully
                    history = []
                history = history + rng.integers(1, 200, 6 + 5 * turn).tolist()
                got = engine.generate(history, max_tokens=6)
                runner.reset()
                want = list(runner.generate(history, 6, temperature=0.0))
                assert got == want, (revision, turn, got, want)
                history = history + got
            functions = {c.function for c in engine.calls}
            assert functions == ({"main", "prefill"} if revision == PREFILL_GRAPH else {"main"})


def test_apple_main_needs_the_apple_layout(tmp_path, capsys):
    code = cli(["export", "mamba2-tiny", "-o", str(tmp_path / "out"), "--apple-main", "chunk", "-q"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--apple-main applies to --layout apple only" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("preset", ["mamba1-tiny", "falcon-mamba-tiny"])
def test_a_family_without_an_apple_layout_is_refused_in_one_line(preset, tmp_path, capsys):
    """Mamba-1's prefill scan unrolls its 8-token blocks (ops.selective_scan.chunk): a fixed T only."""
    code = cli(["export", preset, "-o", str(tmp_path / "out"), "--layout", "apple", "-q"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "mamba1 has no apple layout: Apple's prefill takes a dynamic token count" in err
    assert not (tmp_path / "out").exists()
