"""Qwen3.5 bundles on the Core AI runtime, against transformers' own classes (pure-torch paths)
on the tiny non-square fixtures of tests/hybrid_files.py: fp32 logits within 2e-3 of
transformers with every top-1 equal, the four states equal transformers' cache, prefill exact
against the M=1 loop, snapshots of hybrids (recurrent states + KV rows) restoring bit for bit,
int8keepproj passing its gate, and `ssmport chat` reusing the state across turns with the
checkpoint's own chat template and stop tokens.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from ir_checks import writes_per_state
from prefill_checks import CHUNK, LENGTHS, assert_coreai_prefill_equals_m1_loop, prompt

import hybrid_files as hf
from ssmport.bundle import Bundle
from ssmport.cli.main import main
from ssmport.errors import SsmportError
from ssmport.exporter.pipeline import export
from ssmport.runtime import Runner, StateSnapshot

CONTEXT = 128  # two chat turns; the tiny fixtures allow 256
TOKENS = [3, 17, 5, 60, 9, 11, 2, 44, 80, 7, 30, 12, 1, 95, 50, 21, 8, 64, 33]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen35-ckpt")
    return {"text": hf.write_qwen35_text(root / "text", hf.Qwen35Dims(tied=False), seed=1),
            # widths that are multiples of int8's block of 32, so int8keepproj really stores int8
            "vlm-tied": hf.write_qwen35_vlm(root / "vlm-tied", replace(hf.Qwen35Dims(), tied=True, hidden=64, ffn=96),
                                            seed=2)}  # fmt: skip


@pytest.fixture(scope="module")
def bundles(folders, tmp_path_factory):
    """fp32 bundles of the text-only and the VLM packaging, and int8keepproj of the VLM, each
    gated at export; the fp32 ones with a prefill chunk of CHUNK."""
    out = tmp_path_factory.mktemp("qwen35-bundles")
    kw = {"progress": False, "context": CONTEXT, "prefill_chunk": CHUNK}
    return {
        "text": export(str(folders["text"]), out, quant="fp32", **kw),
        "vlm-tied": export(str(folders["vlm-tied"]), out, quant="fp32", **kw),
        "vlm-int8": export(str(folders["vlm-tied"]), out, quant="int8keepproj", name="vlm-int8", **kw),
    }


@pytest.mark.parametrize("which, folder", [("text", "text"), ("vlm-tied", "vlm-tied")])
def test_fp32_bundle_matches_transformers(bundles, folders, which, folder):
    run = hf.reference_run(folders[folder], TOKENS)
    want = run.step_logits.numpy()
    with Runner(bundles[which].path, prefill=False) as runner:
        got = runner.step_each(TOKENS)
        states = {n: runner.state(n) for n in runner.state_names}
    assert np.abs(got - want).max() <= 2e-3
    assert (got.argmax(-1) == want.argmax(-1)).all()
    cache = hf.stacked_states(run.cache, CONTEXT)
    assert list(cache) == list(states) == ["keyCache", "valueCache", "convStates", "recurrentStates"]
    for name, value in cache.items():
        assert states[name].shape == tuple(value.shape), name
        assert np.abs(states[name] - value.numpy()).max() <= 1e-4 * max(1.0, float(value.abs().max())), name


def test_manifest_records_the_packaging_context_and_states(bundles):
    m = bundles["vlm-tied"].manifest
    assert m.architecture == "qwen3_5" and m.config["context"] == CONTEXT and m.context == CONTEXT
    assert m.source["skipped_tensors"]["mtp.*"] == {"what": "multi-token prediction head", "tensors": 15}
    assert any("model.visual.* (vision tower" in n for n in m.notes)
    assert [(s.name, s.shape, s.kind) for s in m.states] == [
        ("keyCache", (2, 1, 2, -1, 16), "kv"), ("valueCache", (2, 1, 2, -1, 16), "kv"),  # grown up to CONTEXT
        ("convStates", (3, 1, 4, 2 * 2 * 8 + 4 * 12), "fixed"), ("recurrentStates", (3, 1, 4, 8, 12), "fixed"),
    ]  # fmt: skip
    assert [s.context for s in m.kv_states] == [CONTEXT, CONTEXT]
    assert m.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4  # K and V, 2 attention layers, 2 kv heads of 16, fp32
    assert m.tokenizer.config == "tokenizer/tokenizer_config.json" == m.tokenizer.chat_template


def test_one_write_per_state_in_each_function():
    import torch

    from ssmport.exporter.convert import convert
    from ssmport.quant import get_recipe
    from ssmport.quant.plan import WeightBuilder
    from ssmport.loader.resolve import load_model

    model = load_model("qwen3.5-tiny")
    program = convert(model, WeightBuilder(get_recipe("fp32"), model.architecture.keeps_float), torch.float16,
                      prefill_chunk=CHUNK).program  # fmt: skip
    for function in ("main", "prefill"):
        assert writes_per_state(program, function, top_level_only=True) == {
            "keyCache": 1, "valueCache": 1, "convStates": 1, "recurrentStates": 1}


@pytest.mark.parametrize("n", LENGTHS)
def test_prefill_equals_the_m1_loop(bundles, n):
    assert_coreai_prefill_equals_m1_loop(bundles["text"].path, n)


def test_snapshot_restores_a_hybrid_bit_for_bit(bundles, tmp_path):
    """A snapshot holds the recurrent states and the KV rows up to its length; restoring it and
    continuing gives exactly the cold run's logits and states over the same tokens."""
    first, then = prompt(13, 96), prompt(7, 96, seed=4)
    with Runner(bundles["text"].path) as runner:
        runner.feed(first)
        snap = runner.snapshot()
        assert snap.states["keyCache"].shape[3] == 13 and snap.states["recurrentStates"].shape == (3, 1, 4, 8, 12)
        cold = [runner.feed(then[:3]), *(runner.step(t) for t in then[3:])]
        cold_states = {n: runner.state(n) for n in runner.state_names}
        runner.reset()
        runner.feed(prompt(30, 96, seed=9))  # other rows left behind in the cache
        runner.restore(StateSnapshot.load(snap.save(tmp_path / "s.safetensors")))
        warm = [runner.feed(then[:3]), *(runner.step(t) for t in then[3:])]
        for a, b in zip(cold, warm):
            np.testing.assert_array_equal(a, b)
        for n in runner.state_names:
            np.testing.assert_array_equal(cold_states[n], runner.state(n))


def test_feeding_past_the_context_is_refused(bundles):
    with Runner(bundles["text"].path) as runner:
        runner.feed(prompt(CONTEXT, 96))
        with pytest.raises(SsmportError, match=f"context is full: {CONTEXT} tokens held"):
            runner.step(1)
        assert len(runner.tokens) == CONTEXT


def test_int8keepproj_passes_its_gate(bundles):
    m = bundles["vlm-int8"].manifest
    assert m.gate.passed and m.recipe.name == "int8keepproj"
    dtypes: dict[str, set] = {}
    for e in m.plan_tensors:
        dtypes.setdefault(e["role"], set()).add(e["dtype"])
    assert dtypes["ffn"] == dtypes["head"] == dtypes["attn_proj"] == {"int8"}
    assert dtypes["state_proj"] == dtypes["out_proj"] == dtypes["embedding"] == {"float16"}
    assert m.gate.max_rel_logit_delta > 0


def test_inspect_reports_kv_bytes_per_token(bundles, capsys):
    assert main(["inspect", str(bundles["text"].path)]) == 0
    out = capsys.readouterr().out
    assert f"kv cache: {CONTEXT} positions" in out and "512 B per token of context" in out


# --------------------------------------------------------------------------- chat


def test_chat_template_comes_from_tokenizer_config(bundles):
    from ssmport.gate.run import bundle_tokenizer
    from ssmport.runtime.chat import chat_template

    bundle = Bundle.open(bundles["text"].path)
    tok = bundle_tokenizer(bundle)
    t = chat_template(bundle, tok)
    assert t.first_user == "<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n"
    assert t.next_user == "<|im_end|>\n<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n"
    assert set(t.eos_ids) == {tok.encode("<|im_end|>")[0], tok.encode("<|endoftext|>")[0]}


def test_chat_reuses_the_state_across_turns(bundles, tmp_path, capsys):
    script = tmp_path / "turns.txt"
    script.write_text("hello world\nhow are you today?\n")
    assert main(["chat", str(bundles["text"].path), "--script", str(script), "--stats", "-n", "6"]) == 0
    stats = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[prompt")]
    assert len(stats) == 2 and "0 reused" in stats[0]
    first_prompt = int(stats[0].split("prompt ")[1].split(" tokens")[0])
    reply = int(stats[0].split("reply ")[1].split(" tokens")[0])
    assert f"{first_prompt + reply} reused" in stats[1]  # turn 2 feeds only its own tokens

def test_chat_turn_two_equals_a_cold_replay(bundles):
    """Turn 2's first logits with the reused state equal those of the whole transcript fed
    from zero through `main`."""
    from ssmport.gate.run import bundle_tokenizer
    from ssmport.runtime.chat import ChatSession, chat_template

    bundle = Bundle.open(bundles["text"].path)
    tok = bundle_tokenizer(bundle)
    template = chat_template(bundle, tok)
    with Runner(bundle) as runner:
        session = ChatSession(runner, tok, template)
        "".join(session.send("hello world", max_tokens=4))
        history = list(session.transcript)
        turn2 = history + tok.encode(template.user_turn("and then?", first=False))
        warm = session.prefill_to(turn2)
        assert session.last.reused_tokens == len(history)
    with Runner(bundle, prefill=False) as slow:
        want = slow.feed(turn2)
    assert np.abs(warm - want).max() <= 1e-4 and warm.argmax() == want.argmax()


def test_chat_template_with_thinking_and_named_templates(tmp_path):
    """A Qwen3-style template (a history rewrite, a generation prompt that opens <think>) and the
    list-of-named-templates spelling; the turn end is the special token after the reply."""
    from ssmport.tokenizers.chat_template import chat_turns
    from ssmport.tokenizers.hf_json import HFJsonTokenizer

    folder = hf.write_qwen35_text(tmp_path / "q", hf.Qwen35Dims(), seed=0)
    template = (
        "{%- for m in messages %}{%- if m.role == 'assistant' %}{{- '<|im_start|>assistant\\n' + "
        "m.content.split('</think>')[-1] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>' + m.role + '\\n' + "
        "m.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
    )
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "x"}, {"name": "default", "template": template}]
    config["eos_token"] = {"content": "<|im_end|>", "special": True}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = HFJsonTokenizer(folder / "tokenizer.json")
    first, later, stops = chat_turns(folder, tok)
    assert first == "<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert later == "<|im_end|>\n<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert tok.encode("<|im_end|>")[0] in stops
    config["chat_template"] = "{{ raise_exception('no system role') }}"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(SsmportError, match="does not render .*no system role"):
        chat_turns(folder, tok)
