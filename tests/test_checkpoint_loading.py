"""Strict, lazy checkpoint loading: config from shapes, one error naming every problem."""

from __future__ import annotations

import json
import re

import pytest
import torch

import ssmport
from rwkv7_files import Dims, blinkdl_state_dict, fla_from_blinkdl, write_hf_folder, write_pth
from ssmport.errors import CheckpointError, SsmportError
from ssmport.loader.resolve import load_checkpoint, load_model


def test_config_derived_from_shapes(tmp_path):
    d = Dims(width=128, head=32, layers=3, ffn=384, d_w=64, d_a=96, d_v=32, d_g=160, vocab=500)
    model = load_checkpoint(write_pth(tmp_path / "m.pth", blinkdl_state_dict(d, seed=1)))
    c = model.config
    assert (c.vocab_size, c.hidden_size, c.num_layers, c.head_size, c.num_heads, c.ffn_size) == (500, 128, 3, 32, 4, 384)
    assert (c.decay_lora, c.a_lora, c.v_lora, c.gate_lora) == (64, 96, 32, 160)
    assert c.ln_x_eps == 64e-5 and c.has_ln0


def test_one_error_names_every_missing_unexpected_misshaped_key(tmp_path):
    sd = blinkdl_state_dict(Dims(), seed=2)
    del sd["blocks.1.att.k_a"], sd["ln_out.bias"]
    sd["blocks.0.att.surprise"] = torch.zeros(3)
    sd["blocks.1.ffn.value.weight"] = torch.zeros(128, 255)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(write_pth(tmp_path / "bad.pth", sd))
    msg = str(err.value)
    assert "\n" not in msg
    for name in ("blocks.1.att.k_a", "ln_out.bias", "blocks.0.att.surprise", "blocks.1.ffn.value.weight"):
        assert name in msg
    assert "missing 2" in msg and "unexpected 1" in msg and "misshaped 1" in msg
    assert "[128, 255] (expected [128, 256])" in msg


def test_layer0_value_lora_optional_both_ways(tmp_path):
    for present in (True, False):
        sd = blinkdl_state_dict(Dims(), seed=3, layer0_v=present)
        model = load_checkpoint(write_pth(tmp_path / f"v{present}.pth", sd))
        assert "blocks.0.att.v1" not in set(model.weights)


def test_loading_is_lazy_for_safetensors(tmp_path):
    d = Dims()
    folder = write_hf_folder(tmp_path / "f", *fla_from_blinkdl(blinkdl_state_dict(d, seed=4), d))
    model = load_checkpoint(folder)
    assert model.weights.shape("blocks.0.att.w1") == (128, 32)  # canonical [C, D], from fla [D, C]
    assert model.weights["blocks.0.att.w1"].shape == (128, 32)
    assert model.weights["blocks.0.att.x_r"].shape == (128,)


def test_hf_tied_embeddings(tmp_path):
    d = Dims()
    config, tensors = fla_from_blinkdl(blinkdl_state_dict(d, seed=5), d)
    del tensors["lm_head.weight"]
    config["tie_word_embeddings"] = True
    model = load_checkpoint(write_hf_folder(tmp_path / "tied", config, tensors))
    assert torch.equal(model.weights["head.weight"], model.weights["emb.weight"])
    tensors["lm_head.weight"] = tensors["model.embeddings.weight"].clone()  # saved anyway
    model = load_checkpoint(write_hf_folder(tmp_path / "tied-saved", config, tensors))
    assert torch.equal(model.weights["head.weight"], model.weights["emb.weight"])


def test_hf_missing_lm_head_is_an_error_when_untied(tmp_path):
    d = Dims()
    config, tensors = fla_from_blinkdl(blinkdl_state_dict(d, seed=5), d)
    del tensors["lm_head.weight"]
    with pytest.raises(CheckpointError, match="missing 1: lm_head.weight"):
        load_checkpoint(write_hf_folder(tmp_path / "untied", config, tensors))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"attn": {"layers": [1], "num_heads": 2}}, "hybrid attention"),
        ({"hidden_act": "swish"}, "hidden_act"),
        ({"value_dim": [128, 256]}, "per-layer value_dim"),
    ],
)
def test_hf_unsupported_configs_are_named(tmp_path, change, message):
    d = Dims()
    config, tensors = fla_from_blinkdl(blinkdl_state_dict(d, seed=6), d)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(write_hf_folder(tmp_path / "x", config | change, tensors))


def test_hf_missing_shard(tmp_path):
    d = Dims()
    folder = write_hf_folder(tmp_path / "s", *fla_from_blinkdl(blinkdl_state_dict(d, seed=7), d), shards=2)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing: model-00002-of-00002.safetensors"):
        load_checkpoint(folder)


def test_not_a_checkpoint(tmp_path):
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a pickle at all")
    with pytest.raises(CheckpointError, match="not a loadable PyTorch checkpoint"):
        load_checkpoint(junk)
    (tmp_path / "noconf").mkdir()
    with pytest.raises(CheckpointError, match="no config.json"):
        load_checkpoint(tmp_path / "noconf")
    other = tmp_path / "other.pth"
    torch.save({"layer.weight": torch.zeros(2)}, other)
    with pytest.raises(CheckpointError, match="no registered architecture"):
        load_checkpoint(other)


class _RunsCodeWhenUnpickled:
    def __reduce__(self):
        return (print, ("unpickling executed code",))


def test_weights_only_refuses_pickled_code(tmp_path, capsys):
    evil = tmp_path / "evil.pth"
    torch.save({"emb.weight": torch.zeros(2), "x": _RunsCodeWhenUnpickled()}, evil)
    with pytest.raises(CheckpointError, match="not a loadable PyTorch checkpoint"):
        load_checkpoint(evil)
    assert "executed" not in capsys.readouterr().out


def test_presets(tmp_path):
    with pytest.raises(SsmportError, match="BlinkDL/rwkv-7-world: not in the Hugging Face cache"):
        load_model("rwkv7-1.5b")  # offline in the tests: a released preset downloads by default
    with pytest.raises(SsmportError, match="no download source: pass --weights PATH .* or --synthetic"):
        load_model("gated-deltanet-1.3b")
    tiny = load_model("rwkv7-tiny")
    assert tiny.synthetic and tiny.provenance == {"kind": "synthetic", "preset": "rwkv7-tiny", "seed": 0}
    synth = load_model("rwkv7-0.1b", synthetic=True, seed=3)
    assert synth.config.num_layers == 12 and synth.config.hidden_size == 768
    # deterministic, and the seed matters
    a = load_model("rwkv7-tiny").weights["blocks.1.att.w1"]
    assert torch.equal(a, load_model("rwkv7-tiny").weights["blocks.1.att.w1"])
    assert not torch.equal(a, load_model("rwkv7-tiny", synthetic=True, seed=1).weights["blocks.1.att.w1"])
    # a checkpoint given for the wrong preset is refused with the differing dims
    pth = write_pth(tmp_path / "small.pth", blinkdl_state_dict(Dims(), seed=8))
    with pytest.raises(CheckpointError, match="does not match preset rwkv7-1.5b: vocab_size=320"):
        load_model("rwkv7-1.5b", weights=pth)
    with pytest.raises(SsmportError, match="neither a preset"):
        load_model("no-such-thing")


def test_fla_config_defaults(tmp_path):
    """fla derives intermediate_size from hidden_ratio and LoRA ranks left unset."""
    d = Dims(ffn=512)
    config, tensors = fla_from_blinkdl(blinkdl_state_dict(d, seed=9), d)
    for key in ("intermediate_size", "decay_low_rank_dim", "gate_low_rank_dim"):
        config.pop(key)
    config["hidden_ratio"] = 4
    model = load_checkpoint(write_hf_folder(tmp_path / "defaults", config, tensors))
    assert model.config.ffn_size == 512 and model.config.decay_lora == 32
    json.dumps(model.config.to_json())


def test_fla_early_2025_layout_with_stacked_mixes(tmp_path):
    """fla from 2025-01-20 to 2025-04-09 saved the six mixes as attn.x_x [6, C]."""
    d = Dims()
    config, tensors = fla_from_blinkdl(blinkdl_state_dict(d, seed=10), d)
    current = load_checkpoint(write_hf_folder(tmp_path / "current", config, tensors))
    old = dict(tensors)
    for i in range(d.layers):
        h = f"model.layers.{i}.attn."
        old[h + "x_x"] = torch.cat([old.pop(h + f"x_{m}").reshape(1, -1) for m in "rwkvag"])
        old[h + "k_k"] = old[h + "k_k"].reshape(1, 1, -1)  # also seen as [1, 1, C]
    stacked = load_checkpoint(write_hf_folder(tmp_path / "stacked", config, old))
    for name in current.weights:
        assert torch.equal(current.weights[name], stacked.weights[name]), name
    old["model.layers.1.attn.x_x"] = torch.zeros(5, d.width)
    with pytest.raises(CheckpointError, match=r"model.layers.1.attn.x_x \[5, 128\] \(expected \[6, 128\]\)"):
        load_checkpoint(write_hf_folder(tmp_path / "bad", config, old))


def test_fla_vectors_load_as_c_or_1x1xc_and_nothing_else(tmp_path):
    """fla saved per-channel vectors [C] in some versions and [1, 1, C] in others: both load
    to the same weights; any other shape is refused, reported against the canonical [C]."""
    d = Dims()
    config, tensors = fla_from_blinkdl(blinkdl_state_dict(d, seed=11), d)
    vector = lambda n: ".attn.x_" in n or n.endswith(("attn.k_k", "attn.k_a", "ffn.x_k"))  # noqa: E731
    flat = {n: t.reshape(-1) if vector(n) else t for n, t in tensors.items()}
    unsqueezed = {n: t.reshape(1, 1, -1) if vector(n) else t for n, t in tensors.items()}
    assert sum(map(vector, tensors)) == d.layers * 9  # six mixes, k_k, k_a, the channel mix's x_k
    a = load_checkpoint(write_hf_folder(tmp_path / "flat", config, flat))
    b = load_checkpoint(write_hf_folder(tmp_path / "unsqueezed", config, unsqueezed))
    for name in a.weights:
        assert torch.equal(a.weights[name], b.weights[name]), name
    flat["model.layers.0.ffn.x_k"] = flat["model.layers.0.ffn.x_k"].reshape(1, -1)
    with pytest.raises(CheckpointError, match=r"model.layers.0.ffn.x_k \[1, 128\] \(expected \[128\]\)"):
        load_checkpoint(write_hf_folder(tmp_path / "bad", config, flat))


@pytest.mark.parametrize(
    "preset, key, value",
    [("lfm2-tiny", "num_kv_heads", 1), ("granite-hybrid-tiny", "num_kv_heads", 1),
     ("granite-hybrid-tiny", "mamba_heads", 4), ("nemotron-h-tiny", "pattern", "M-*M*-M"),
     ("nemotron-h-tiny", "mamba_heads", 4), ("qwen3.5-tiny", "num_key_value_heads", 1)],
)  # fmt: skip
def test_a_checkpoint_differing_from_its_preset_in_one_declared_key_is_refused(preset, key, value):
    """Each architecture declares the config keys a checkpoint must share with its presets
    (`Architecture.preset_keys`); the hybrids' KV heads and Nemotron-H's pattern were once missed."""
    import dataclasses

    from ssmport.architectures import get_architecture, presets
    from ssmport.loader.resolve import _check_matches_preset

    p = presets()[preset]
    arch = get_architecture(p.architecture)
    config = arch.config_from_json(dict(p.config))
    assert getattr(config, key) != value
    same = ssmport.LoadedModel(arch, config, None, {"kind": "hf", "path": "/ckpt"})
    _check_matches_preset(same, p)  # the preset's own config passes
    other = ssmport.LoadedModel(arch, dataclasses.replace(config, **{key: value}), None, {"kind": "hf", "path": "/ckpt"})
    with pytest.raises(CheckpointError, match=f"does not match preset {re.escape(preset)}: {key}="):
        _check_matches_preset(other, p)
