"""`--layout apple` for the hybrids: Apple's Qwen3.5 layout (docs/apple-engines.md, sections 7-8),
checked on the Core AI runtime.

keyCache / valueCache have a dynamic position axis (so the engines' heuristic takes them for KV
caches and the pipelined engine drives the bundle), the fixed conv / recurrent states are
static; `prefill` has no outputs, `main` takes one token and returns fp16 logits. For each
hybrid's tiny preset: the signatures, metadata.json's states, check-engine's verdicts, the gate,
logits against the fp32 torch reference through the runner (prefill + main, and main alone), a
snapshot round trip, and multi-turn conversations fed exactly as Apple's pipelined engine (which
grows the KV states as it goes) and sequential engine feed them, generating the ids ssmport's
own runner generates.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import torch
import pytest

from apple_protocol import PipelinedEngine, SequentialEngine
from ssmport.apple.sources import PREFILL_GRAPH
from ssmport.bundle import Bundle
from ssmport.cli.main import main as cli
from ssmport.exporter.pipeline import export
from ssmport.runtime import Runner
from ssmport.loader.resolve import load_model
from ssmport.gate.torch_runner import TorchRunner
from test_apple_layout import describe

# preset -> (its tokenizer family in tests/hybrid_files.py, its fixed states after the KV pair)
HYBRIDS = {
    "qwen3.5-tiny": ("qwen3_5", ["convStates", "recurrentStates"]),
    "lfm2-tiny": ("lfm2", ["convStates"]),
    "granite-hybrid-tiny": ("granite", ["convStates", "recurrentStates"]),
    "nemotron-h-tiny": ("nemotron_h", ["convStates", "recurrentStates"]),
    "olmo-hybrid-tiny": ("qwen3_5", ["convStates", "recurrentStates"]),
    "falcon-h1-tiny": ("falcon_h1", ["convStates", "recurrentStates"]),
    # the mixture-of-experts hybrids: their dense siblings' states, routed experts in the MLPs
    "lfm2-moe-tiny": ("lfm2", ["convStates"]),
    "qwen3.5-moe-tiny": ("qwen3_5", ["convStates", "recurrentStates"]),
    "nemotron-moe-tiny": ("nemotron_h", ["convStates", "recurrentStates"]),
    "granite-moe-tiny": ("granite", ["convStates", "recurrentStates"]),
}
KV_PAIR = ["keyCache", "valueCache"]


@pytest.fixture(scope="module", params=sorted(HYBRIDS))
def hybrid_bundle(request, tmp_path_factory):
    preset = request.param
    family, _ = HYBRIDS[preset]
    out = tmp_path_factory.mktemp("apple-hybrid")
    from hybrid_files import write_tokenizer

    model = load_model(preset, synthetic=True)
    write_tokenizer(out, model.config.vocab_size, family)
    result = export(preset, out / "bundles", quant="fp32", layout="apple", gate_steps=6, progress=False,
                    vocab=out / "tokenizer.json")  # fmt: skip
    return preset, result


def test_signatures_states_and_metadata(hybrid_bundle):
    preset, result = hybrid_bundle
    m, fixed = result.manifest, HYBRIDS[preset][1]
    V, context = m.vocab_size, m.context
    assert m.layout == "apple" and m.gate.passed
    assert [t.key for t in m.main.inputs] == [("input_ids", (1, 1), "int32"), ("position_ids", (1, -1), "int32")]
    assert [t.key for t in m.main.outputs] == [("logits", (1, 1, V), "float16")]
    assert [t.key for t in m.prefill.inputs] == [("input_ids", (1, -1), "int32"), ("position_ids", (1, -1), "int32")]
    assert m.prefill.outputs == () and m.prefill.chunk == min(512, context)
    assert [s.name for s in m.states] == KV_PAIR + fixed
    for s in m.states[:2]:  # Apple's [n_attn, 1, kv_heads, S?, head_dim]
        assert s.kind == "kv" and s.shape[3] == -1 and -1 not in s.shape[:3] + s.shape[4:]
        assert s.max_context == context and s.full_shape[3] == context
    assert all(s.kind == "fixed" and -1 not in s.shape for s in m.states[2:])
    meta = json.loads((result.path / "metadata.json").read_text())
    assert meta["language"]["max_context_length"] == context and meta["language"]["vocab_size"] == V
    assert meta["language"]["states"] == dict.fromkeys(KV_PAIR, "kv_cache") | dict.fromkeys(fixed, "fixed")
    assert (result.path / "tokenizer" / "tokenizer.json").is_file()
    assert (result.path / "tokenizer" / "tokenizer_config.json").is_file()


def test_check_engine_says_both_engines_drive_it(hybrid_bundle, capsys):
    _, result = hybrid_bundle
    assert cli(["check-engine", str(result.path)]) == 0
    out = capsys.readouterr().out
    assert "coreai-pipelined @prefill-graph  drives  (default engine)" in out
    assert "coreai-sequential @prefill-graph  drives" in out


def test_the_fixed_context_cache_is_what_the_pipelined_engine_refuses(hybrid_bundle, capsys):
    """The same bundle described with a static position axis (as the ssmport layout stores its
    cache): the heuristic takes a static "...Cache" for a sliding cache and the pipelined engine
    finds no KV pair. That is why the apple layout makes S dynamic."""
    from ssmport.apple import check_engines
    from ssmport.apple.description import FunctionDesc, TensorDesc

    _, result = hybrid_bundle
    desc = describe(Bundle.open(result.path))
    static = {name: FunctionDesc(f.inputs, f.outputs, tuple(TensorDesc(s.name, tuple(result.manifest.context if d is None
              else d for d in s.shape), s.dtype) for s in f.states)) for name, f in desc.functions.items()}  # fmt: skip
    verdicts = {(v.engine, v.revision): v for v in check_engines(replace(desc, functions=static))}
    pipelined = verdicts[("coreai-pipelined", PREFILL_GRAPH)]
    assert not pipelined.can_drive and any("kv_pair" in str(g) for g in pipelined.failures)


def test_runner_matches_the_reference_and_snapshots_round_trip(hybrid_bundle):
    preset, result = hybrid_bundle
    model = load_model(preset, synthetic=True)
    tokens = np.random.default_rng(3).integers(1, model.config.vocab_size, 21).tolist()
    want = TorchRunner(model).step_each(tokens + [5, 6])
    scale = np.abs(want).max()
    with Runner(result.path) as runner:
        fed = runner.feed(tokens)  # prefill for all but the last token, main for the last
        snap = runner.snapshot()
        after = runner.step_each([5, 6])
        runner.reset()
        each = runner.step_each(tokens)
        runner.restore(snap)
        again = runner.step_each([5, 6])
    assert np.abs(each - want[:21]).max() / scale < 1e-3  # fp16 logits: 2^-11 of a logit at most
    assert np.abs(fed - want[20]).max() / scale < 1e-3
    assert np.abs(after - want[21:]).max() / scale < 1e-3
    assert np.array_equal(after, again)
    assert snap.states["keyCache"].shape[3] == len(tokens)


def _conversation(engine, runner, seed: int) -> None:
    rng = np.random.default_rng(seed)
    history: list[int] = []
    for turn, restart in enumerate((False, False, True)):
        if restart:  # a new conversation: the history diverges, the engine resets
            history = []
        history = history + rng.integers(1, 200, 6 + 5 * turn).tolist()
        got = engine.generate(history, max_tokens=6)
        runner.reset()
        want = list(runner.generate(history, 6, temperature=0.0))
        assert got == want, (type(engine).__name__, turn, got, want)
        history = history + got


def test_apples_engines_generate_what_the_runner_generates(hybrid_bundle):
    """Three turns as CoreAIPipelinedEngine feeds them (prefill in balanced chunks, the last
    token through `main`, the KV caches grown by copying into buffers twice the size from 4
    positions up, the fixed states zeroed on a reset) and as CoreAISequentialEngine does, over
    the real runtime (`Runner.call` on the engines' own buffers), against ssmport's runner."""
    _, result = hybrid_bundle
    with Runner(result.path) as runner:
        pipelined = PipelinedEngine(describe(Bundle.open(result.path)), runner, revision=PREFILL_GRAPH,
                                    chunk_threshold=8, kv_initial=4)  # fmt: skip
        _conversation(pipelined, runner, 11)
        grown = pipelined.states.arrays["keyCache"].shape[3]
        assert grown > 4  # it grew
        assert {c.function for c in pipelined.calls} == {"main", "prefill"}
        sequential = SequentialEngine(describe(Bundle.open(result.path)), runner, revision=PREFILL_GRAPH,
                                      chunk_threshold=8)  # fmt: skip
        _conversation(sequential, runner, 12)


def test_a_dynamic_position_axis_needs_its_max_context():
    from ssmport.errors import BundleError
    from ssmport.manifest import StateEntry
    from ssmport.state import KV, StateSpec

    entry = {"name": "keyCache", "shape": [2, 1, 2, -1, 16], "dtype": "float32", "kind": "kv"}
    assert StateEntry.from_json(entry | {"max_context": 64}, "m").full_shape == (2, 1, 2, 64, 16)
    for bad in (entry, entry | {"max_context": 0}, entry | {"shape": [2, 1, 2, 8, 16], "max_context": 64}):
        with pytest.raises(BundleError, match="max_context"):
            StateEntry.from_json(bad, "m")
    assert StateSpec("k", (2, 1, 2, -1, 16), torch.float32, "", KV, max_context=64).zeros().shape == (2, 1, 2, 64, 16)
    with pytest.raises(ValueError, match="max_context"):
        StateSpec("k", (2, 1, 2, -1, 16), torch.float32, "", KV)
    with pytest.raises(ValueError, match="dynamic"):
        StateSpec("c", (2, -1, 4), torch.float32, "", max_context=64)
