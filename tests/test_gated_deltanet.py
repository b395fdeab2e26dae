"""Gated DeltaNet in torch: readable reference <-> transformers' Qwen3-Next functions <-> export
form, and strict loading of fla folders."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gdn_files import GDNDims, fla_gdn_config, fla_gdn_tensors, transformers_reference_logits, write_gdn_folder
from ssmport.errors import CheckpointError
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.loader.resolve import load_checkpoint, load_model

TOKENS = [1, 5, 77, 3, 3, 300, 12, 9, 0, 383, 44, 44, 44, 2, 100]

# dk != dv and GVA in every variant, so a transposed state or a wrong head mapping cannot pass.
VARIANTS = {
    "gva": GDNDims(),
    "neg-eigval-tied-biased-conv": GDNDims(allow_neg_eigval=True, tie=True, conv_bias=True, v_heads=2, expand_v=2),
    "no-gate": GDNDims(use_gate=False, heads=1, v_heads=3, expand_v=0.5, head_dim=32),
}


def rel_err(ref: torch.Tensor, got: torch.Tensor) -> float:
    return float((ref - got).abs().max() / ref.abs().max().clamp_min(1.0))


def _eager_decode(model, recipe="fp32", state_dtype=torch.float32):
    arch = model.architecture
    builder = WeightBuilder(get_recipe(recipe), arch.keeps_float)
    return arch.build_decode(model.config, model.weights, builder, state_dtype).eval(), builder


def _decode_logits(module, tokens):
    with torch.no_grad():
        return torch.stack(
            [module(torch.tensor([[t]], dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32))[0, 0] for t in tokens]
        )


def _reference_logits(model, tokens):
    ref = model.architecture.reference(model.config, model.weights)
    state = ref.zero_state()
    return torch.stack([ref.step(t, state) for t in tokens]), state


@pytest.fixture(scope="module", params=list(VARIANTS))
def folder(request, tmp_path_factory):
    return write_gdn_folder(tmp_path_factory.mktemp(request.param), VARIANTS[request.param], seed=7)


def test_reference_and_export_form_match_transformers(folder):
    chunked = transformers_reference_logits(folder, TOKENS)
    looped = transformers_reference_logits(folder, TOKENS, chunked=False)
    model = load_checkpoint(folder)
    ours, _ = _reference_logits(model, TOKENS)
    export_form = _decode_logits(_eager_decode(model)[0], TOKENS)
    assert ours.shape == chunked.shape == (len(TOKENS), 384)
    for theirs in (chunked, looped):
        assert rel_err(theirs, ours) < 1e-5
        assert rel_err(theirs, export_form) < 1e-5
    assert torch.equal(ours.argmax(-1), chunked.argmax(-1))
    assert rel_err(ours, export_form) < 1e-5


def test_state_layout_is_key_major_with_grouped_value_heads(tmp_path):
    """recState [L, 1, HV, dk, dv] with dk=16 != dv=24; convState holds the last W-1 pre-conv
    q | k | v projections, oldest first. Both equal the reference loop's state."""
    d = GDNDims()
    model = load_checkpoint(write_gdn_folder(tmp_path / "m", d, seed=2))
    specs = model.architecture.state_specs(model.config, torch.float32)
    assert [(s.name, s.shape) for s in specs] == [
        ("convState", (2, 1, 3, 2 * 2 * 16 + 4 * 24)),
        ("recState", (2, 1, 4, 16, 24)),
    ]
    _, ref_state = _reference_logits(model, TOKENS[:6])
    module, _ = _eager_decode(model)
    _decode_logits(module, TOKENS[:6])
    for i in range(d.layers):
        assert torch.allclose(module.recState[i, 0], ref_state["S"][i], atol=1e-5)
        conv = ref_state["conv"][i]
        assert torch.allclose(module.convState[i, 0], torch.cat([conv["q"], conv["k"], conv["v"]], dim=1), atol=1e-5)


def test_fp16_state_storage_keeps_fp32_recurrence(tmp_path):
    model = load_checkpoint(write_gdn_folder(tmp_path / "m", GDNDims(), seed=3))
    f32 = _decode_logits(_eager_decode(model)[0], TOKENS)
    module, _ = _eager_decode(model, state_dtype=torch.float16)
    f16 = _decode_logits(module, TOKENS)
    assert module.recState.dtype == module.convState.dtype == torch.float16
    assert 0 < rel_err(f32, f16) < 5e-3


def test_quant_predicate_keeps_the_recurrence_inputs_float(tmp_path):
    model = load_checkpoint(write_gdn_folder(tmp_path / "m", GDNDims(), seed=4))
    _, builder = _eager_decode(model, recipe="int8keepproj")
    plan = {e.name: e.dtype for e in builder.entries}
    a, m = "model.layers.1.attn.", "model.layers.1.mlp."
    assert plan[a + "{q,k,v,a,b,g}_proj.weight"] == "float16"
    assert plan[a + "o_proj.weight"] == "float16"
    assert plan[m + "{gate,up}_proj.weight"] == plan[m + "down_proj.weight"] == plan["lm_head.weight"] == "int8"
    for name in (a + "{q,k,v}_conv1d.weight", a + "A_log", a + "dt_bias", a + "o_norm.weight", "model.norm.weight"):
        assert plan[name] == "float32", name
    _, builder = _eager_decode(model, recipe="int8")
    assert {e.name: e.dtype for e in builder.entries}[a + "{q,k,v,a,b,g}_proj.weight"] == "int8"


def test_config_follows_fla_defaults(tmp_path):
    """intermediate_size null -> fla's 256-rounded 2/3 * ratio * hidden; num_v_heads null -> num_heads;
    keys fla's config class defaults may be absent."""
    d = GDNDims(v_heads=2)
    folder = write_gdn_folder(tmp_path / "m", d, seed=5)
    cj = json.loads((folder / "config.json").read_text())
    cj["num_v_heads"] = None
    for key in ("norm_eps", "conv_size", "use_gate", "allow_neg_eigval", "fuse_norm"):
        cj.pop(key)
    (folder / "config.json").write_text(json.dumps(cj))
    c = load_checkpoint(folder).config
    assert c.intermediate_size == 256 == 256 * math.ceil(int(96 * 2 * 2 / 3) / 256)
    assert (c.num_heads, c.num_v_heads, c.head_dim, c.head_v_dim) == (2, 2, 16, 24)
    assert (c.conv_size, c.use_gate, c.allow_neg_eigval, c.norm_eps) == (4, True, False, 1e-6)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"attn": {"layers": [1], "num_heads": 4}}, "hybrid attention layers"),
        ({"attnres_block_size": 2}, "attention residuals"),
        ({"hidden_act": "powlu"}, "hidden_act='powlu'"),
        ({"use_short_conv": False}, "use_short_conv=false"),
        ({"num_v_heads": 3}, "not a multiple of num_heads"),
    ],
)
def test_unsupported_configs_are_one_clear_line(tmp_path, change, message):
    d = GDNDims()
    folder = write_gdn_folder(tmp_path / "m", d, seed=6)
    (folder / "config.json").write_text(json.dumps(fla_gdn_config(d) | change))
    with pytest.raises(CheckpointError, match=message) as err:
        load_checkpoint(folder)
    assert "\n" not in str(err.value)


def test_strict_loading_names_every_problem(tmp_path):
    from safetensors.torch import save_file

    d = GDNDims()
    sd = fla_gdn_tensors(d, seed=8)
    del sd["model.layers.1.attn.dt_bias"], sd["lm_head.weight"]
    sd["model.layers.0.attn.gk_proj.weight"] = torch.zeros(4, 96)
    sd["model.layers.0.attn.v_conv1d.weight"] = torch.zeros(95, 1, 4)
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(fla_gdn_config(d)))
    save_file(sd, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(folder)
    msg = str(err.value)
    assert "\n" not in msg and "missing 2" in msg and "unexpected 1" in msg and "misshaped 1" in msg
    for name in ("model.layers.1.attn.dt_bias", "lm_head.weight", "model.layers.0.attn.gk_proj.weight"):
        assert name in msg
    assert "model.layers.0.attn.v_conv1d.weight [95, 1, 4] (expected [96, 1, 4])" in msg


def test_tied_embeddings_with_and_without_saved_head(tmp_path):
    d = GDNDims(tie=True)
    model = load_checkpoint(write_gdn_folder(tmp_path / "tied", d, seed=9))
    assert torch.equal(model.weights["lm_head.weight"], model.weights["model.embeddings.weight"])
    sd = fla_gdn_tensors(d, seed=9)
    sd["lm_head.weight"] = sd["model.embeddings.weight"] * 2  # saved anyway: it is the head
    from safetensors.torch import save_file

    save_file(sd, str(tmp_path / "tied" / "model.safetensors"))
    model = load_checkpoint(tmp_path / "tied")
    assert torch.equal(model.weights["lm_head.weight"], 2 * model.weights["model.embeddings.weight"])


def test_early_2025_checkpoints_with_unused_D_load(tmp_path):
    """fla saved an unused per-head `attn.D` until 2025-03-12; it changes nothing."""
    from safetensors.torch import save_file

    d = GDNDims(v_heads=2)
    folder = write_gdn_folder(tmp_path / "old", d, seed=11)
    new = load_checkpoint(folder)
    sd = fla_gdn_tensors(d, seed=11) | {f"model.layers.{i}.attn.D": torch.ones(2) for i in range(d.layers)}
    save_file(sd, str(folder / "model.safetensors"))
    old = load_checkpoint(folder)
    assert set(old.weights) == set(new.weights)
    sd["model.layers.0.attn.D"] = torch.ones(3)
    save_file(sd, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"attn.D \[3\] \(expected \[2\]\)"):
        load_checkpoint(folder)


def test_bf16_sharded_folder_loads_lazily(tmp_path):
    folder = write_gdn_folder(tmp_path / "bf16", GDNDims(), seed=10, dtype=torch.bfloat16, shards=3)
    model = load_checkpoint(folder)
    assert model.weights.dtype("model.layers.0.attn.q_proj.weight") == torch.bfloat16
    assert model.weights["model.layers.0.attn.q_proj.weight"].dtype == torch.float32
    ours, _ = _reference_logits(model, TOKENS[:5])
    assert rel_err(transformers_reference_logits(folder, TOKENS[:5]), ours) < 1e-5


def test_presets_have_fla_geometry(tmp_path):
    from ssmport.models.gated_deltanet.checkpoints import canonical_shapes

    big = load_model("gated-deltanet-1.3b", synthetic=True)
    c = big.config
    assert (c.hidden_size, c.num_layers, c.num_heads, c.head_dim, c.head_v_dim, c.intermediate_size) == (
        2048, 21, 6, 256, 512, 5632)  # fmt: skip
    params = sum(math.prod(s) for s in canonical_shapes(c).values())
    assert 1.25e9 < params < 1.45e9
    with pytest.raises(Exception, match="--weights PATH"):
        load_model("gated-deltanet-1.3b")
    like_tiny = dict(vocab=512, hidden=128, layers=2, heads=2, head_dim=32, v_heads=4, expand_v=1.5, hidden_ratio=3)
    same = load_model("gated-deltanet-tiny", weights=write_gdn_folder(tmp_path / "same", GDNDims(**like_tiny), seed=1))
    assert same.name == "gated-deltanet-tiny" and same.provenance["kind"] == "hf"
    other = write_gdn_folder(tmp_path / "other", GDNDims(**like_tiny | dict(head_dim=16, expand_v=3)), seed=1)
    with pytest.raises(CheckpointError, match=r"does not match preset gated-deltanet-tiny: head_dim=16 \(preset 32\)"):
        load_model("gated-deltanet-tiny", weights=other)
    tiny = load_model("gated-deltanet-tiny")
    assert tiny.synthetic and tiny.config.num_v_heads > tiny.config.num_heads
    assert tiny.config.head_v_dim != tiny.config.head_dim
    w = tiny.weights["model.layers.1.attn.A_log"]
    assert torch.equal(w, load_model("gated-deltanet-tiny").weights["model.layers.1.attn.A_log"])
