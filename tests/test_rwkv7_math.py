"""The RWKV-7 step: readable reference <-> BlinkDL's `rwkv` package <-> export form."""

from __future__ import annotations

import torch

from rwkv7_files import Dims, blinkdl_state_dict, fla_from_blinkdl, rwkv_package_logits, write_hf_folder
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.loader.resolve import load_checkpoint

TOKENS = [3, 17, 17, 250, 0, 99, 5, 318, 42, 42, 7, 1]


def rel_err(ref: torch.Tensor, got: torch.Tensor) -> float:
    """max |Δ| relative to the logit scale: fp32 sums in a different order differ by ~1e-6."""
    return float((ref - got).abs().max() / ref.abs().max().clamp_min(1.0))


def _eager_decode(model, state_dtype=torch.float32):
    arch = model.architecture
    builder = WeightBuilder(get_recipe("fp32"), arch.keeps_float)
    return arch.build_decode(model.config, model.weights, builder, state_dtype).eval()


def _decode_logits(module, tokens):
    rows = []
    with torch.no_grad():
        for t in tokens:
            rows.append(module(torch.tensor([[t]], dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32))[0, 0])
    return torch.stack(rows)


def _reference_logits(model, tokens):
    ref = model.architecture.reference(model.config, model.weights)
    state = ref.zero_state()
    return torch.stack([ref.step(t, state) for t in tokens]), state


def test_reference_matches_blinkdl_rwkv_package(blinkdl_pth):
    model = load_checkpoint(blinkdl_pth)
    ours, _ = _reference_logits(model, TOKENS)
    theirs = rwkv_package_logits(blinkdl_pth, TOKENS)
    assert ours.shape == theirs.shape == (len(TOKENS), 320)
    assert rel_err(theirs, ours) < 1e-5
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_reference_matches_package_on_bf16_checkpoint_without_layer0_v(blinkdl_bf16_pth):
    model = load_checkpoint(blinkdl_bf16_pth)
    ours, _ = _reference_logits(model, TOKENS)
    theirs = rwkv_package_logits(blinkdl_bf16_pth, TOKENS)
    assert rel_err(theirs, ours) < 1e-5


def test_export_form_matches_reference(blinkdl_pth):
    model = load_checkpoint(blinkdl_pth)
    ref, _ = _reference_logits(model, TOKENS)
    got = _decode_logits(_eager_decode(model), TOKENS)
    assert rel_err(ref, got) < 1e-5


def test_key_value_unequal_state_layout(tmp_path):
    """fla models may have value_dim > hidden (per-head V != K). With K != V a transposed
    state cannot pass by accident: recState must be [L, 1, H, K, V], and equal the
    transpose of the reference's BlinkDL-layout [H, V, K] state."""
    d = Dims(width=64, head=16, layers=2)
    config, tensors = fla_from_blinkdl(blinkdl_state_dict(d, seed=5), d)
    C, Cv = d.width, 2 * d.width  # per-head value 32, key 16
    g = torch.Generator().manual_seed(6)
    for i in range(d.layers):
        h = f"model.layers.{i}.attn."
        tensors[h + "v_proj.weight"] = torch.randn(Cv, C, generator=g) / C**0.5
        tensors[h + "o_proj.weight"] = torch.randn(C, Cv, generator=g) / Cv**0.5
        tensors[h + "g_lora.lora.2.weight"] = torch.randn(Cv, d.d_g, generator=g) * 0.1
        tensors[h + "g_norm.weight"] = 1 + 0.1 * torch.randn(Cv, generator=g)
        tensors[h + "g_norm.bias"] = 0.1 * torch.randn(Cv, generator=g)
        if i > 0:
            tensors[h + "v_lora.lora.2.weight"] = torch.randn(Cv, d.d_v, generator=g) * 0.1
            tensors[h + "v_lora.lora.2.bias"] = 0.5 * torch.randn(Cv, generator=g)
    config["value_dim"] = [Cv] * d.layers
    model = load_checkpoint(write_hf_folder(tmp_path / "kv", config, tensors))
    H = C // d.head
    assert model.architecture.state_specs(model.config, torch.float32)[0].shape == (2, 1, H, 16, 32)

    ref, ref_state = _reference_logits(model, TOKENS[:5])
    module = _eager_decode(model)
    got = _decode_logits(module, TOKENS[:5])
    assert rel_err(ref, got) < 1e-5
    for i in range(d.layers):
        blinkdl = ref_state["wkv"][i]  # [H, V, K]
        assert torch.allclose(module.recState[i, 0], blinkdl.transpose(1, 2), atol=1e-5)


def test_fla_folder_gives_same_logits_as_blinkdl_file(blinkdl_pth, fla_folder):
    a = _decode_logits(_eager_decode(load_checkpoint(blinkdl_pth)), TOKENS)
    b = _decode_logits(_eager_decode(load_checkpoint(fla_folder)), TOKENS)
    assert rel_err(a, b) < 1e-5


def test_groupnorm_eps_follows_each_format(tmp_path):
    """BlinkDL fixes ln_x eps at 64e-5; fla uses head_dim * norm_eps. They agree at head
    size 64 (every released model) and must each be honoured elsewhere."""
    d = Dims(width=64, head=16)
    sd = blinkdl_state_dict(d, seed=3)
    from rwkv7_files import write_pth

    blink = load_checkpoint(write_pth(tmp_path / "m.pth", sd))
    fla = load_checkpoint(write_hf_folder(tmp_path / "fla", *fla_from_blinkdl(sd, d)))
    assert blink.config.ln_x_eps == 64e-5
    assert fla.config.ln_x_eps == 16 * 1e-5


def test_fp16_state_storage_keeps_fp32_recurrence(blinkdl_pth):
    """Storing the state in fp16 only rounds what is carried between steps."""
    model = load_checkpoint(blinkdl_pth)
    f32 = _decode_logits(_eager_decode(model, torch.float32), TOKENS)
    f16_module = _eager_decode(model, torch.float16)
    f16 = _decode_logits(f16_module, TOKENS)
    assert f16_module.recState.dtype == torch.float16
    assert 0 < (f32 - f16).abs().max() < 0.05
