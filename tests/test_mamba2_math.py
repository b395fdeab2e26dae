"""Mamba-2: ssmport's reference loop and decode module against transformers' Mamba2ForCausalLM
(its pure-torch path on CPU), strict loading of both checkpoint layouts, presets, quant plan."""

from __future__ import annotations

import json

import pytest
import torch

from mamba2_files import (
    Geometry,
    transformers_logits,
    transformers_step_logits,
    write_mamba_ssm_folder,
    write_transformers_folder,
)
from ssmport.errors import CheckpointError, SsmportError
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.loader.resolve import load_checkpoint, load_model
from ssmport.gate.torch_runner import TorchRunner

TOKENS = [1, 5, 77, 3, 3, 150, 9, 0, 12, 44, 44, 101, 7, 2, 159, 30]
GROUPS2 = Geometry()  # H4 P32 N24, 2 groups, untied head
TIED_BIASED = Geometry(heads=8, head_dim=16, state=20, groups=4, conv=3, conv_bias=False, bias=True)


def reference_logits(folder, tokens) -> torch.Tensor:
    model = load_checkpoint(folder)
    ref = model.architecture.reference(model.config, model.weights)
    state = ref.zero_state()
    return torch.stack([ref.step(t, state) for t in tokens])


@pytest.fixture(scope="module")
def groups2(tmp_path_factory):
    return write_transformers_folder(tmp_path_factory.mktemp("m2") / "groups2", GROUPS2, seed=3, tied=False, shards=2)


@pytest.mark.parametrize(
    "geometry,tied,extra",
    [(GROUPS2, False, {}), (TIED_BIASED, True, {}), (GROUPS2, True, {"time_step_limit": [0.0, 0.05]})],
    ids=["groups2-untied", "tied-biases-K3", "dt-clamped"],
)
def test_reference_matches_transformers(tmp_path, geometry, tied, extra):
    folder = write_transformers_folder(tmp_path / "m", geometry, seed=5, tied=tied, **extra)
    theirs = transformers_logits(folder, TOKENS)
    ours = reference_logits(folder, TOKENS)
    assert (ours - theirs).abs().max() < 2e-5 * max(1.0, theirs.abs().max())
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_decode_module_matches_reference_and_transformers_cache(groups2):
    model = load_checkpoint(groups2)
    runner = TorchRunner(model, "fp32")
    ours = torch.from_numpy(runner.step_each(TOKENS))
    assert (ours - reference_logits(groups2, TOKENS)).abs().max() < 1e-5
    theirs, cache = transformers_step_logits(groups2, TOKENS)
    assert (ours - theirs).abs().max() < 2e-5 * max(1.0, theirs.abs().max())
    # transformers' cache: conv [C, K] (last K inputs; ssmport's is time-major, its transpose), ssm [H, P, N].
    for i in range(GROUPS2.layers):
        torch.testing.assert_close(runner.module.convState[i, 0].t(), cache.get_conv_state(i, state_idx=0)[0])
        torch.testing.assert_close(runner.module.ssmState[i, 0], cache.get_recurrent_state(i, state_idx=0)[0])


def test_fp16_recipe_in_torch_is_close_but_not_exact(groups2):
    model = load_checkpoint(groups2)
    ref = torch.from_numpy(TorchRunner(model, "fp32").step_each(TOKENS))
    half = torch.from_numpy(TorchRunner(model, "fp16").step_each(TOKENS))
    rel = ((half - ref).abs().max() / ref.abs().max()).item()
    assert 1e-6 < rel < get_recipe("fp16").gate.max_rel_logit_delta


def test_mamba_ssm_folder_matches_transformers(tmp_path):
    """state-spaces layout: mamba_ssm config, `backbone.embedding.weight`, .bin, padded vocab."""
    g = Geometry(vocab=176, groups=1)
    ssm_folder = write_mamba_ssm_folder(tmp_path / "ssm", g, seed=8, vocab_unpadded=170)
    hf_folder = write_transformers_folder(tmp_path / "hf", g, seed=8, tied=True)
    model = load_checkpoint(ssm_folder)
    assert model.architecture.name == "mamba2" and model.config.vocab_size == 176
    ours = reference_logits(ssm_folder, TOKENS)
    theirs = transformers_logits(hf_folder, TOKENS)
    assert (ours - theirs).abs().max() < 2e-5 * max(1.0, theirs.abs().max())


def test_strict_loading_names_every_problem(groups2, tmp_path):
    from safetensors.torch import load_file, save_file
    import shutil

    folder = shutil.copytree(groups2, tmp_path / "broken")
    shard = sorted(folder.glob("*.safetensors"))[0]
    tensors = load_file(shard)
    victim = sorted(tensors)[0]
    tensors.pop(victim)
    tensors["backbone.layers.0.mixer.extra"] = torch.zeros(3)
    save_file(tensors, shard)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"].pop(victim)
    index["weight_map"]["backbone.layers.0.mixer.extra"] = shard.name
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(folder)
    msg = str(err.value)
    assert f"missing 1: {victim}" in msg and "unexpected 1: backbone.layers.0.mixer.extra" in msg


def test_misshaped_and_untied_missing_head(tmp_path):
    folder = write_transformers_folder(tmp_path / "tied", GROUPS2, seed=1, tied=True)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg | {"tie_word_embeddings": False}))
    with pytest.raises(CheckpointError, match="missing 1: lm_head.weight"):
        load_checkpoint(folder)
    (folder / "config.json").write_text(json.dumps(cfg | {"state_size": 16}))
    with pytest.raises(CheckpointError, match="misshaped .*in_proj.weight"):
        load_checkpoint(folder)


@pytest.mark.parametrize(
    "change,message",
    [
        ({"norm_before_gate": True}, "norm_before_gate"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"expand": 3}, "hidden_size x expand .* must equal num_heads x head_dim"),
        ({"n_groups": 3}, "do not divide"),
    ],
)
def test_unsupported_transformers_configs_are_named(tmp_path, change, message):
    folder = write_transformers_folder(tmp_path / "m", GROUPS2, seed=1, tied=True)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg | change))
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(folder)


@pytest.mark.parametrize(
    "change,message",
    [({"d_intermediate": 256}, "d_intermediate"), ({"attn_layer_idx": [1]}, "attention"),
     ({"ssm_cfg": {"layer": "Mamba2", "norm_before_gate": True}}, "norm_before_gate")],
)  # fmt: skip
def test_unsupported_mamba_ssm_configs_are_named(tmp_path, change, message):
    folder = write_mamba_ssm_folder(tmp_path / "ssm", Geometry(groups=1), seed=1, vocab_unpadded=160)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg | change))
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(folder)


def test_quant_predicate_plan(groups2):
    model = load_checkpoint(groups2)
    builder = WeightBuilder(get_recipe("int8keepproj"), model.architecture.keeps_float)
    model.architecture.build_decode(model.config, model.weights, builder, torch.float32)
    dtypes = {e["name"]: e["dtype"] for e in builder.plan_json()}
    assert dtypes["lm_head.weight"] == "int8"
    for i in range(GROUPS2.layers):
        m = f"layers.{i}.mixer."
        assert dtypes[m + "in_proj.weight"] == "float16" and dtypes[m + "out_proj.weight"] == "float16"
        for vec in ("conv1d.weight", "conv1d.bias", "A_log", "dt_bias", "D", "norm.weight"):
            assert dtypes[m + vec] == "float32", vec


def test_presets():
    released = {"mamba2-130m": (24, 768), "mamba2-370m": (48, 1024), "mamba2-780m": (48, 1536),
                "mamba2-1.3b": (48, 2048), "mamba2-2.7b": (64, 2560)}  # fmt: skip
    for name, (layers, width) in released.items():
        model = load_model(name, synthetic=True)
        c = model.config
        assert (c.num_layers, c.hidden_size, c.vocab_size) == (layers, width, 50288)
        assert (c.state_size, c.head_dim, c.num_heads, c.n_groups, c.conv_kernel) == (128, 64, 2 * width // 64, 1, 4)
        assert model.weights.shape("layers.0.mixer.in_proj.weight") == (2 * 2 * width + 2 * 128 + 2 * width // 64, width)
        with pytest.raises(SsmportError, match=f"state-spaces/{name}: not in the Hugging Face cache"):
            load_model(name)  # offline in the tests: a released preset downloads by default
    w = load_model("mamba2-130m", synthetic=True).weights
    torch.testing.assert_close(w["layers.3.mixer.A_log"], load_model("mamba2-130m", synthetic=True).weights["layers.3.mixer.A_log"])


def test_weights_for_a_preset_must_match_it(groups2):
    with pytest.raises(CheckpointError, match="does not match preset mamba2-130m"):
        load_model("mamba2-130m", weights=groups2)


def test_folder_saved_by_transformers_itself(tmp_path):
    """config.json exactly as transformers writes it (inf as {"__float__": "Infinity"}, its
    defaults spelled out) and a tied head that save_pretrained leaves out."""
    from transformers import Mamba2Config, Mamba2ForCausalLM

    torch.manual_seed(0)
    config = Mamba2Config(vocab_size=200, hidden_size=64, num_hidden_layers=2, num_heads=4, head_dim=32,
                          state_size=24, n_groups=2, expand=2, tie_word_embeddings=True)  # fmt: skip
    Mamba2ForCausalLM(config).save_pretrained(tmp_path / "saved")
    ours = reference_logits(tmp_path / "saved", TOKENS)
    theirs = transformers_logits(tmp_path / "saved", TOKENS)
    assert (ours - theirs).abs().max() < 2e-5 * max(1.0, theirs.abs().max())
