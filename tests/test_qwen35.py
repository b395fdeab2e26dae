"""Qwen3.5 in torch, against transformers' own `Qwen3_5ForCausalLM` / `Qwen3_5ForConditionalGeneration`
(pure-torch paths: `hybrid_files.assert_torch_paths`, run by every reference helper) on tiny
non-square configs (kv heads != heads, k dim != v dim, v heads != k heads): the plain reference
loop and the export-form module match its logits and its cache; both packagings load, the VLM's
vision tower and mtp.* skipped by prefix and said so; every config option that changes the math
is read or refused in one line; the presets are the released sizes.

The Core AI side (bundles, prefill, snapshots, chat) is tests/test_qwen35_coreai.py.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch
from prefill_checks import CHUNK, LENGTHS, prompt, run_prefill

import hybrid_files as hf
from ssmport.architectures import get_architecture
from ssmport.errors import SsmportError
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.loader.resolve import load_checkpoint, load_model
from ssmport.gate.torch_runner import TorchRunner

QWEN = get_architecture("qwen3_5")
TOKENS = [3, 17, 5, 60, 9, 11, 2, 44, 80, 7, 30, 12, 1, 95, 50]
FOLDERS = ("qwen35-text", "qwen35-text-tied", "qwen35-vlm", "qwen35-vlm-tied")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen35")
    return {
        "qwen35-text": hf.write_qwen35_text(root / "qwen35-text", hf.Qwen35Dims(tied=False), seed=1),
        "qwen35-text-tied": hf.write_qwen35_text(root / "qwen35-text-tied", hf.Qwen35Dims(tied=True), seed=2),
        "qwen35-vlm": hf.write_qwen35_vlm(root / "qwen35-vlm", hf.Qwen35Dims(tied=False), seed=1),
        "qwen35-vlm-tied": hf.write_qwen35_vlm(root / "qwen35-vlm-tied", hf.Qwen35Dims(tied=True), seed=2),
    }


@pytest.fixture(scope="module")
def runs(folders):
    return {name: hf.reference_run(folders[name], TOKENS) for name in FOLDERS}


def _rel(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))


def _limit(want, own_twin) -> float:
    """1e-5 of scale, or twice what transformers' own two fp32 forms of the same run (token by
    token vs one sequence) disagree by, if more: on the tied configs that is 1.9e-5 of scale
    (measured on an AVX-512/AMX Xeon), so two fp32 computations cannot be held to 1e-5 there."""
    return max(1e-5, 2 * _rel(own_twin, want))


def _reference_logits(model, tokens):
    ref = model.architecture.reference(model.config, model.weights)
    state = ref.zero_state()
    return torch.stack([ref.step(t, state) for t in tokens]).numpy()


# --------------------------------------------------------------------------- vs transformers


@pytest.mark.parametrize("name", FOLDERS)
def test_reference_and_export_form_match_transformers(folders, runs, name):
    model = load_checkpoint(folders[name])
    want = runs[name].step_logits.numpy()
    ref = _reference_logits(model, TOKENS)
    runner = TorchRunner(model)
    got = runner.step_each(TOKENS)
    limit = _limit(want, runs[name].logits.numpy())
    assert _rel(ref, want) < limit and _rel(got, want) < limit
    assert (ref.argmax(-1) == want.argmax(-1)).all() and (got.argmax(-1) == want.argmax(-1)).all()


@pytest.mark.parametrize("name", ["qwen35-text", "qwen35-vlm-tied"])
def test_states_equal_transformers_cache(folders, runs, name):
    """keyCache / valueCache (K after k-norm and RoPE, zero past the last token), convStates
    (the last K pre-conv inputs, time-major) and recurrentStates (key-major) are transformers'
    cache, stacked (hybrid_files.stacked_states)."""
    model = load_checkpoint(folders[name])
    runner = TorchRunner(model)
    runner.step_each(TOKENS)
    want = hf.stacked_states(runs[name].cache, model.config.context)
    twin = hf.stacked_states(runs[name].prefill_cache, model.config.context)
    assert list(want) == [s.name for s in runner.specs]  # Apple's four states, in Apple's order
    for state, value in want.items():
        got = getattr(runner.module, state)
        assert got.shape == value.shape, state
        assert _rel(got, value) <= _limit(value, twin[state]), state


def test_the_two_packagings_give_the_same_weights(folders):
    text, vlm = load_checkpoint(folders["qwen35-text"]), load_checkpoint(folders["qwen35-vlm"])
    # the VLM packaging carries the MTP head too (loaded: mtp_layers 1); the language model is the same
    assert replace(vlm.config, mtp_layers=0) == text.config and vlm.config.mtp_layers == 1
    assert list(text.weights) == [n for n in vlm.weights if not n.startswith("mtp.")]
    for name in text.weights:
        assert torch.equal(text.weights[name], vlm.weights[name]), name


def test_tied_head_is_the_embedding(folders):
    model = load_checkpoint(folders["qwen35-vlm-tied"])
    assert model.config.tie_word_embeddings
    assert torch.equal(model.weights["lm_head.weight"], model.weights["model.embed_tokens.weight"])


@pytest.mark.parametrize("dims", [
    replace(hf.Qwen35Dims(), partial_rotary=0.25, mrope_section=(1, 0, 1)),  # rotary dim 4 of 16
    replace(hf.Qwen35Dims(), partial_rotary=1.0, mrope_section=(3, 3, 2), rope_theta=1e6),  # all dims rotate
    replace(hf.Qwen35Dims(), heads=6, kv_heads=3, head_dim=8, linear_k_heads=1, linear_v_heads=3, linear_k_dim=12,
            linear_v_dim=4, conv=3, layer_types=("full_attention", "linear_attention", "linear_attention")),
], ids=["partial-0.25", "full-rotary", "other-shapes"])  # fmt: skip
def test_rope_and_shape_variants_match_transformers(tmp_path, dims):
    """Partial RoPE at other fractions and text-only mRoPE with other sections (no effect on
    text), GQA 2:1, GVA 3:1, a 3-tap conv, attention first."""
    folder = hf.write_qwen35_text(tmp_path / "q", dims, seed=5)
    want = hf.reference_run(folder, TOKENS[:9]).step_logits.numpy()
    model = load_checkpoint(folder)
    assert model.config.rotary_dim == int(dims.head_dim * dims.partial_rotary)
    assert _rel(TorchRunner(model).step_each(TOKENS[:9]), want) < 1e-5
    assert _rel(_reference_logits(model, TOKENS[:9]), want) < 1e-5


def test_attention_biases_match_transformers(tmp_path):
    """attention_bias: q_proj's bias is [query | gate] per head like its rows."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    d = hf.Qwen35Dims()
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**hf._qwen35_text_config(d), attention_bias=True)).eval()
    hf._fill_trained_like(model, 9)
    folder = hf._save(model, tmp_path / "bias", lambda c: c.update(hf.QWEN35_RELEASED_TEXT_KEYS), family="qwen3_5")
    want = hf.reference_run(folder, TOKENS[:8]).step_logits.numpy()
    loaded = load_checkpoint(folder)
    assert loaded.config.attention_bias
    assert _rel(TorchRunner(loaded).step_each(TOKENS[:8]), want) < 1e-5


# --------------------------------------------------------------------------- packaging


def test_vlm_packaging_skips_the_vision_tower_and_mtp_by_prefix(folders):
    model = load_checkpoint(folders["qwen35-vlm"])
    skipped = model.provenance["skipped_tensors"]
    assert skipped == {"model.visual.*": {"what": "vision tower", "tensors": skipped["model.visual.*"]["tensors"]},
                       "mtp.*": {"what": "multi-token prediction head", "tensors": 15}}  # fmt: skip
    assert skipped["model.visual.*"]["tensors"] > 0
    assert len(model.notes) == 1 and "\n" not in model.notes[0]
    assert "model.visual.* (vision tower" in model.notes[0] and "mtp.* (multi-token prediction head, 15)" in model.notes[0]
    assert not any("visual" in n for n in model.weights)
    # config.json declares the MTP head and it is there: loaded (strictly) for an export with
    # --verify, still recorded as skipped until an export uses it (tests/test_mtp.py)
    assert sum(n.startswith("mtp.") for n in model.weights) == 15 and model.config.mtp_layers == 1
    assert load_checkpoint(folders["qwen35-text"]).notes == []


def _tensors(folder):
    from safetensors import safe_open

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            out |= {k: h.get_tensor(k) for k in h.keys()}
    return out


def _rewrite(src, dst, tensors=None, config_edit=None):
    from safetensors.torch import save_file

    shutil.copytree(src, dst)
    if tensors is not None:
        for f in dst.glob("model.safetensors*"):
            f.unlink()
        save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    if config_edit is not None:
        config = json.loads((dst / "config.json").read_text())
        config_edit(config)
        (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_only_the_named_prefixes_are_skipped(folders, tmp_path):
    tensors = _tensors(folders["qwen35-vlm"])
    stray = _rewrite(folders["qwen35-vlm"], tmp_path / "stray", tensors | {"model.audio.proj.weight": torch.zeros(2)})
    with pytest.raises(SsmportError, match=r"unexpected 1: model\.audio\.proj\.weight") as err:
        load_checkpoint(stray)
    assert "\n" not in str(err.value)
    name = "model.language_model.layers.2.self_attn.q_norm.weight"
    missing = _rewrite(folders["qwen35-vlm"], tmp_path / "missing", {k: v for k, v in tensors.items() if k != name})
    with pytest.raises(SsmportError, match=f"missing 1: {name}"):
        load_checkpoint(missing)


def test_untied_needs_its_head(folders, tmp_path):
    tensors = {k: v for k, v in _tensors(folders["qwen35-text"]).items() if k != "lm_head.weight"}
    with pytest.raises(SsmportError, match="missing 1: lm_head.weight"):
        load_checkpoint(_rewrite(folders["qwen35-text"], tmp_path / "headless", tensors))


# --------------------------------------------------------------------------- config


def _set(key, value, text=True):
    def edit(c):
        (c["text_config"] if text and "text_config" in c else c)[key] = value

    return edit


REFUSALS = [
    ("qwen35-text", _set("model_type", "qwen3_next"), "Qwen3-Next .* is not supported"),
    ("qwen35-text", _set("attn_output_gate", False), "attn_output_gate=false"),
    ("qwen35-text", _set("mlp_only_layers", [1]), r"mlp_only_layers=\[1\]"),
    ("qwen35-text", _set("hidden_act", "gelu"), "hidden_act='gelu'"),
    ("qwen35-text", _set("layer_types", ["linear_attention"] * 4 + ["sliding_attention"]), "sliding_attention"),
    ("qwen35-text", _set("layer_types", ["linear_attention"] * 5), "no full_attention layer"),
    ("qwen35-text", _set("layer_types", ["full_attention"] * 4), "layer_types has 4 entries"),
    ("qwen35-text", _set("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}), "rope_type='yarn'"),
    ("qwen35-text", _set("rope_scaling", {"type": "linear"}), "rope_scaling="),
    ("qwen35-text", _set("partial_rotary_factor", 0.75), "partial_rotary_factor=0.75 but rope_parameters says 0.5"),
    ("qwen35-text", _set("linear_num_value_heads", 3), "not a multiple of linear_num_key_heads"),
    ("qwen35-text", _set("num_experts", 8), "routed experts"),
    ("qwen35-vlm", _set("tie_word_embeddings", True), "ambiguous"),
    ("qwen35-text", _set("num_hidden_layers", 10 ** 6), r"num_hidden_layers=1000000 is outside"),
]  # fmt: skip


@pytest.mark.parametrize("base, edit, message", REFUSALS, ids=[m for _, _, m in REFUSALS])
def test_config_refusals_are_one_line(folders, tmp_path, base, edit, message):
    folder = _rewrite(folders[base], tmp_path / "c", config_edit=edit)
    with pytest.raises(SsmportError, match=message) as err:
        load_checkpoint(folder)
    assert "\n" not in str(err.value)


def test_layer_types_default_from_the_interval(tmp_path):
    """Without layer_types, layer i is full attention iff (i+1) % full_attention_interval == 0
    (transformers' rule; the interval is 4 when absent)."""
    dims = replace(hf.Qwen35Dims(), layer_types=("linear_attention", "full_attention") * 2)
    folder = hf.write_qwen35_text(tmp_path / "q", dims, seed=6)

    def edit(c):
        c.pop("layer_types")
        c["full_attention_interval"] = 2

    implicit = _rewrite(folder, tmp_path / "implicit", config_edit=edit)
    want = hf.reference_run(implicit, TOKENS[:6]).step_logits.numpy()
    model = load_checkpoint(implicit)
    assert model.config.layer_types == dims.layer_types
    assert _rel(TorchRunner(model).step_each(TOKENS[:6]), want) < 1e-5
    default = _rewrite(folder, tmp_path / "default", config_edit=lambda c: (c.pop("layer_types"), c.pop("full_attention_interval")))
    with pytest.raises(SsmportError, match="missing .*layers.1.linear_attn"):  # interval 4: only layer 3 attends
        load_checkpoint(default)


# --------------------------------------------------------------------------- presets


@pytest.mark.parametrize("preset, params", [("qwen3.5-0.8b", 752_393_024), ("qwen3.5-2b", 1_881_825_088),
                                            ("qwen3.5-4b", 4_205_751_296), ("qwen3.5-9b", 8_953_803_264)])  # fmt: skip
def test_presets_are_the_released_sizes(preset, params):
    """Each preset's tensors count what transformers builds from the same text config (meta
    device, tied head once): the numbers docs/hybrids.md records for the released models."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    hf.assert_torch_paths()
    cfg = load_model(preset, synthetic=True).config
    shapes = QWEN.synthetic_weights(cfg, 0).shapes()
    ours = sum(int(np.prod(s)) for n, s in shapes.items() if not (cfg.tie_word_embeddings and n == "lm_head.weight"))
    text = {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_layers, "layer_types": list(cfg.layer_types),
            "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim, "linear_num_key_heads": cfg.linear_num_key_heads,
            "linear_num_value_heads": cfg.linear_num_value_heads, "linear_key_head_dim": cfg.linear_key_head_dim,
            "linear_value_head_dim": cfg.linear_value_head_dim, "tie_word_embeddings": cfg.tie_word_embeddings}  # fmt: skip
    with torch.device("meta"):
        theirs = sum(p.numel() for p in Qwen3_5ForCausalLM(Qwen3_5TextConfig(**text)).parameters())
    assert ours == theirs == params
    assert cfg.context == 4096 and cfg.rotary_dim == 64


# --------------------------------------------------------------------------- prefill, quant, context


@pytest.mark.parametrize("n", LENGTHS)
def test_eager_prefill_equals_the_reference(n):
    from prefill_checks import eager_modules, reference_run

    model = load_model("qwen3.5-tiny")
    module = eager_modules(model)[1]
    tokens = prompt(n, model.config.vocab_size)
    got = run_prefill(module, tokens)
    want, _ = reference_run(model, tokens)
    assert float((got - want).abs().max()) / float(want.abs().max()) < 1e-5
    assert not module.keyCache[:, :, :, n:].any()  # padding rows never land past the last real token
    assert CHUNK == 8


def test_int8keepproj_plan():
    model = load_model("qwen3.5-tiny")
    builder = WeightBuilder(get_recipe("int8keepproj"), QWEN.keeps_float)
    with torch.no_grad():
        QWEN.build_decode(model.config, model.weights, builder, torch.float32)
    dtypes = {}
    for e in builder.entries:
        dtypes.setdefault(e.role, set()).add(e.dtype)
    assert dtypes["ffn"] == dtypes["head"] == dtypes["attn_proj"] == {"int8"}
    assert dtypes["state_proj"] == dtypes["out_proj"] == dtypes["embedding"] == {"float16"}
    assert dtypes["conv"] == dtypes["decay"] == dtypes["norm"] == {"float32"}


def test_torch_runner_refuses_past_the_context():
    model = load_model("qwen3.5-tiny")
    runner = TorchRunner(model)
    assert runner.context == 64
    runner.step_each(list(range(64)))
    with pytest.raises(SsmportError, match="the context is full: 64 tokens held"):
        runner.step(1)


def test_context_is_a_kv_option(tmp_path):
    from ssmport.exporter.pipeline import export

    with pytest.raises(SsmportError, match="--context sizes a KV cache, and rwkv7 has none"):
        export("rwkv7-tiny", tmp_path, context=128, progress=False)
    with pytest.raises(SsmportError, match="beyond the model's max_position_embeddings"):
        export("qwen3.5-tiny", tmp_path, context=257, progress=False)
    with pytest.raises(SsmportError, match="whole number of positions"):
        export("qwen3.5-tiny", tmp_path, context=0, progress=False)
    assert not any(tmp_path.iterdir())
