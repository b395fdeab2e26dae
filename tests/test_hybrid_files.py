"""The hybrid fixtures (tests/hybrid_files.py) load back through transformers, its cached and
full-sequence paths agree, and every config feature ssmport must honour really changes
transformers' output. Facts docs/hybrids.md states about transformers' math and cache
layouts are pinned here against transformers itself."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

import hybrid_files as hf

TOKENS = [3, 17, 5, 60, 9, 11, 2, 44, 80, 7, 30, 12]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return hf.write_all(tmp_path_factory.mktemp("hybrid"))


@pytest.fixture(scope="module")
def runs(folders):
    return {name: hf.reference_run(f, TOKENS) for name, f in folders.items()}


def _keys(folder):
    names = set()
    for f in folder.glob("*.safetensors"):
        with safe_open(str(f), "pt") as h:
            names |= set(h.keys())
    return names


def _differs(a, b, at_least=1e-3):
    return (a - b).abs().max().item() > at_least


# --------------------------------------------------------------------------- guard


def test_transformers_takes_its_torch_paths():
    hf.assert_torch_paths()


def test_guard_fails_when_a_kernel_package_is_importable(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "fla" else real(name, *a))
    with pytest.raises(AssertionError, match="fla"):
        hf.assert_torch_paths()


# --------------------------------------------------------------------------- self-consistency


@pytest.mark.parametrize("name", ["qwen35-text", "qwen35-text-tied", "qwen35-vlm", "qwen35-vlm-tied", "lfm2",
                                  "lfm2-legacy", "granite-h", "nemotron-h"])  # fmt: skip
def test_cached_steps_match_the_full_forward(runs, name):
    # reference_run already asserted it; the logits are also non-trivial
    run = runs[name]
    assert run.logits.shape == (len(TOKENS), 96)
    assert run.logits.std() > 0.1
    assert (run.step_logits - run.logits).abs().max() <= hf.STEP_VS_FULL_RTOL * run.logits.abs().max()


EXPECTED_STATES = {  # the non-square shapes the dims were chosen for
    "qwen35-text": {"keyCache": (2, 1, 2, 12, 16), "convStates": (3, 1, 4, 2 * 2 * 8 + 4 * 12),
                    "recurrentStates": (3, 1, 4, 8, 12)},
    "lfm2": {"keyCache": (2, 1, 2, 12, 12), "convStates": (3, 1, 3, 48)},
    "granite-h": {"keyCache": (2, 1, 2, 12, 12), "convStates": (3, 1, 4, 6 * 16 + 2 * 2 * 8),
                  "recurrentStates": (3, 1, 6, 16, 8)},
    "nemotron-h": {"keyCache": (2, 1, 2, 12, 16), "convStates": (3, 1, 4, 4 * 20 + 2 * 2 * 8),
                   "recurrentStates": (3, 1, 4, 20, 8)},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(EXPECTED_STATES))
def test_stacked_state_shapes(runs, name):
    states = hf.stacked_states(runs[name].cache)
    expected = EXPECTED_STATES[name] | {"valueCache": EXPECTED_STATES[name]["keyCache"]}
    assert {k: tuple(v.shape) for k, v in states.items()} == expected
    padded = hf.stacked_states(runs[name].cache, context=20)
    assert padded["keyCache"].shape[3] == 20
    assert torch.equal(padded["keyCache"][:, :, :, :12], states["keyCache"])
    assert not padded["valueCache"][:, :, :, 12:].any()


# --------------------------------------------------------------------------- Qwen3.5 packaging


def test_vlm_packaging_carries_vision_and_mtp_and_the_same_language_model(folders, runs):
    vlm, text = folders["qwen35-vlm"], folders["qwen35-text"]
    config = json.loads((vlm / "config.json").read_text())
    assert config["model_type"] == "qwen3_5" and config["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert config["text_config"]["model_type"] == "qwen3_5_text"
    assert sorted(p.name for p in vlm.glob("*.safetensors")) == [
        "model.safetensors-00001-of-00002.safetensors", "model.safetensors-00002-of-00002.safetensors"]
    names = _keys(vlm)
    assert any(n.startswith("model.visual.") for n in names)
    assert len([n for n in names if n.startswith("mtp.")]) == 15
    assert "model.language_model.embed_tokens.weight" in names and "lm_head.weight" in names
    assert not any(n.startswith("model.layers.") for n in names)
    assert {n for n in _keys(text) if n.startswith("model.")} == {
        "model." + n.removeprefix("model.language_model.") for n in names if n.startswith("model.language_model.")
    }
    # the vision tower and mtp.* do not take part in text-only logits
    torch.testing.assert_close(runs["qwen35-vlm"].logits, runs["qwen35-text"].logits, rtol=0, atol=1e-5)
    vlm_states, text_states = (hf.stacked_states(runs[n].cache) for n in ("qwen35-vlm", "qwen35-text"))
    for name in text_states:
        torch.testing.assert_close(vlm_states[name], text_states[name], rtol=0, atol=1e-5)


def test_the_text_class_loads_the_vlm_folder(folders, runs):
    from transformers import Qwen3_5ForCausalLM

    model = Qwen3_5ForCausalLM.from_pretrained(str(folders["qwen35-vlm-tied"]), dtype=torch.float32).eval()
    run = hf.reference_run(folders["qwen35-vlm-tied"], TOKENS, model=model)
    torch.testing.assert_close(run.logits, runs["qwen35-text-tied"].logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name,tied", [("qwen35-text", False), ("qwen35-text-tied", True), ("qwen35-vlm", False),
                                       ("qwen35-vlm-tied", True), ("lfm2", True), ("granite-h", True),
                                       ("nemotron-h", False)])  # fmt: skip
def test_tied_heads_are_not_stored(folders, name, tied):
    config = json.loads((folders[name] / "config.json").read_text())
    assert config["tie_word_embeddings"] is tied
    if "text_config" in config:
        assert config["text_config"]["tie_word_embeddings"] is tied
    assert ("lm_head.weight" in _keys(folders[name])) is not tied


# --------------------------------------------------------------------------- features that change the output


def _write_and_run(tmp_path, writer, dims, seed, tag):
    return hf.full_logits(writer(tmp_path / tag, dims, seed=seed), TOKENS)


@pytest.mark.parametrize("multiplier", ["embedding_multiplier", "residual_multiplier", "attention_multiplier",
                                        "logits_scaling"])  # fmt: skip
def test_each_granite_multiplier_changes_the_logits(tmp_path, runs, multiplier):
    d = hf.GraniteDims()
    assert d.multipliers[multiplier] != 1.0
    ones = replace(d, multipliers=d.multipliers | {multiplier: 1.0})
    assert _differs(_write_and_run(tmp_path, hf.write_granite_h, ones, 4, multiplier), runs["granite-h"].logits)


def test_granite_nope_is_not_rope(tmp_path, runs):
    rope = replace(hf.GraniteDims(), position_embedding_type="rope")
    assert _differs(_write_and_run(tmp_path, hf.write_granite_h, rope, 4, "rope"), runs["granite-h"].logits)


def test_qwen35_partial_rotary_and_theta_change_the_logits(tmp_path, runs):
    base = runs["qwen35-text"].logits
    full_rotary = replace(hf.Qwen35Dims(), partial_rotary=1.0, mrope_section=(4, 2, 2))
    assert _differs(_write_and_run(tmp_path, hf.write_qwen35_text, full_rotary, 1, "full-rotary"), base)
    theta = replace(hf.Qwen35Dims(), rope_theta=1e6)
    assert _differs(_write_and_run(tmp_path, hf.write_qwen35_text, theta, 1, "theta"), base)


@pytest.mark.parametrize("section", [(4, 0, 0), (1, 1, 2)])
def test_qwen35_mrope_sections_do_not_matter_for_text(tmp_path, runs, section):
    """Text-only positions are equal on the t, h and w axes, so mRoPE is plain partial
    RoPE whatever `mrope_section` says."""
    d = replace(hf.Qwen35Dims(), mrope_section=section)
    logits = _write_and_run(tmp_path, hf.write_qwen35_text, d, 1, f"mrope-{section}")
    torch.testing.assert_close(logits, runs["qwen35-text"].logits, rtol=0, atol=1e-6)


def test_qwen35_attn_output_gate_key_is_not_read_by_transformers(tmp_path, folders, runs):
    """transformers 5.24 always gates (q_proj is 2x wide); the released key is inert there,
    so ssmport must refuse `attn_output_gate: false` rather than follow it."""
    folder = tmp_path / "no-gate"
    folder.mkdir()
    for f in folders["qwen35-text"].iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    config = json.loads((folder / "config.json").read_text()) | {"attn_output_gate": False}
    (folder / "config.json").write_text(json.dumps(config))
    torch.testing.assert_close(hf.full_logits(folder, TOKENS), runs["qwen35-text"].logits, rtol=0, atol=0)


PERMUTATIONS = [("qwen35-text", [0, 2, 1, 3, 4]), ("lfm2", [0, 2, 1, 3, 4]), ("granite-h", [1, 0, 2, 3, 4]),
                ("nemotron-h", [0, 2, 1, 3, 4, 5, 6])]  # fmt: skip


@pytest.mark.parametrize("name,order", PERMUTATIONS)
def test_the_layer_pattern_changes_the_logits(tmp_path, folders, runs, name, order):
    same = hf.write_permuted(folders[name], tmp_path / "identity", list(range(len(order))))
    torch.testing.assert_close(hf.full_logits(same, TOKENS), runs[name].logits, rtol=0, atol=0)
    moved = hf.write_permuted(folders[name], tmp_path / "moved", order)
    src, dst = (hf.layer_types_of(json.loads((f / "config.json").read_text())) for f in (folders[name], moved))
    assert src != dst and sorted(src) == sorted(dst)
    assert _differs(hf.full_logits(moved, TOKENS), runs[name].logits)


def test_lfm2_legacy_keys_are_the_same_model(folders, runs):
    legacy = json.loads((folders["lfm2-legacy"] / "config.json").read_text())
    assert {"full_attn_idxs", "block_ff_dim", "tie_embedding"} <= legacy.keys() and "layer_types" not in legacy
    torch.testing.assert_close(runs["lfm2-legacy"].logits, runs["lfm2"].logits, rtol=0, atol=0)


def test_released_spellings_are_what_the_fixtures_write(folders):
    granite = json.loads((folders["granite-h"] / "config.json").read_text())
    assert set(granite["layer_types"]) == {"mamba", "attention"} and granite["position_embedding_type"] == "nope"
    assert granite["num_local_experts"] == 0
    assert not any("block_sparse_moe" in n for n in _keys(folders["granite-h"]))
    nemotron = json.loads((folders["nemotron-h"] / "config.json").read_text())
    assert nemotron["hybrid_override_pattern"] == "M*-M-*M" and "layers_block_type" not in nemotron
    assert all(n.startswith(("backbone.", "lm_head.")) for n in _keys(folders["nemotron-h"]))


# --------------------------------------------------------------------------- facts docs/hybrids.md relies on


def test_norm_conventions():
    from transformers.models.granitemoehybrid.modeling_granitemoehybrid import GraniteMoeHybridRMSNormGated
    from transformers.models.lfm2.modeling_lfm2 import Lfm2RMSNorm
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHRMSNormGated
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm, Qwen3_5RMSNormGated

    g = torch.Generator().manual_seed(0)
    x, z, w = (torch.randn(3, 12, generator=g) for _ in range(3))
    w = w[0]

    def rms(v, eps):
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)

    def load(module, weight):
        module.weight.data.copy_(weight)
        return module

    torch.testing.assert_close(load(Qwen3_5RMSNorm(12, eps=1e-6), w)(x), rms(x, 1e-6) * (1 + w))  # zero-centred
    torch.testing.assert_close(load(Qwen3_5RMSNormGated(12, eps=1e-6), w)(x, z), w * rms(x, 1e-6) * F.silu(z))
    torch.testing.assert_close(load(Lfm2RMSNorm(12, eps=1e-5), w)(x), w * rms(x, 1e-5))
    for gated in (GraniteMoeHybridRMSNormGated, NemotronHRMSNormGated):  # gate first, then RMS per group of 6
        y = (x * F.silu(z)).view(3, 2, 6)
        torch.testing.assert_close(load(gated(12, group_size=6, eps=1e-5), w)(x, z), w * rms(y, 1e-5).view(3, 12))


def _layer0_input(model, ids):
    """The normed input of layer 0's mixer, from transformers' own submodules."""
    name, layer = type(model).__name__, model.model.layers[0]
    if name == "Qwen3_5ForCausalLM":
        return layer.input_layernorm(model.model.embed_tokens(ids))
    if name == "Lfm2ForCausalLM":
        return layer.operator_norm(model.model.embed_tokens(ids))
    if name == "GraniteMoeHybridForCausalLM":
        return layer.input_layernorm(model.model.embed_tokens(ids) * model.config.embedding_multiplier)
    return layer.norm(model.model.embeddings(ids))


def _layer0_mixer(model):
    layer = model.model.layers[0]
    for attr in ("linear_attn", "conv", "mamba", "mixer"):
        if getattr(layer, attr, None) is not None:
            return getattr(layer, attr)


def _layer0_preconv(model, ids):
    """Layer 0's pre-conv inputs [T, C]."""
    h, mixer = _layer0_input(model, ids), _layer0_mixer(model)
    name = type(model).__name__
    if name == "Qwen3_5ForCausalLM":
        return mixer.in_proj_qkv(h)[0]
    if name == "Lfm2ForCausalLM":
        b, _, x = mixer.in_proj(h).chunk(3, dim=-1)
        return (b * x)[0]  # LFM2 caches B*x, not x
    return mixer.in_proj(h)[0, :, mixer.intermediate_size : mixer.intermediate_size + mixer.conv_dim]


def _states_after(folder, tokens, model):
    return hf.stacked_states(hf.reference_run(folder, tokens, model=model).cache)


@pytest.mark.parametrize("name", ["qwen35-text", "lfm2", "granite-h", "nemotron-h"])
@pytest.mark.parametrize("n", [2, 7])
@torch.no_grad()
def test_conv_state_holds_the_last_k_inputs_oldest_first(folders, name, n):
    model = hf.load_transformers(folders[name])
    ids = torch.tensor([TOKENS[:n]])
    conv = _states_after(folders[name], TOKENS[:n], model)["convStates"][0, 0]
    pre = _layer0_preconv(model, ids)
    k = conv.shape[0]
    expected = torch.cat([torch.zeros(max(0, k - n), pre.shape[1]), pre[-k:]])  # left zero-padded when n < K
    torch.testing.assert_close(conv, expected, rtol=0, atol=1e-5)


@torch.no_grad()
def test_qwen35_recurrent_state_is_key_major_and_value_heads_share_kk_heads_in_blocks(folders):
    """After one token from zero: S[hv] = beta[hv] * l2norm(k[hv // (HV/H)]) (x) v[hv], [k_dim, v_dim]."""
    d = hf.Qwen35Dims()
    model = hf.load_transformers(folders["qwen35-text"])
    state = _states_after(folders["qwen35-text"], TOKENS[:1], model)["recurrentStates"][0, 0]
    attn = _layer0_mixer(model)
    h = _layer0_input(model, torch.tensor([TOKENS[:1]]))
    w = attn.conv1d.weight[:, 0, -1]  # a first token sees only the newest tap
    qkv = F.silu(attn.in_proj_qkv(h)[0, 0] * w)
    kd = d.linear_k_heads * d.linear_k_dim
    k = F.normalize(qkv[kd : 2 * kd].view(d.linear_k_heads, d.linear_k_dim), dim=-1)
    v = qkv[2 * kd :].view(d.linear_v_heads, d.linear_v_dim)
    beta = torch.sigmoid(attn.in_proj_b(h)[0, 0])
    per_group = d.linear_v_heads // d.linear_k_heads
    expected = torch.stack([beta[j] * torch.outer(k[j // per_group], v[j]) for j in range(d.linear_v_heads)])
    torch.testing.assert_close(state, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["granite-h", "nemotron-h"])
@torch.no_grad()
def test_mamba2_state_is_head_dim_by_state_and_heads_share_groups_in_blocks(folders, name):
    """After one token from zero: S[h] = dt[h] * x[h] (x) B[h // (H/G)], [head_dim, d_state]."""
    model = hf.load_transformers(folders[name])
    state = _states_after(folders[name], TOKENS[:1], model)["recurrentStates"][0, 0]
    mixer, ids = _layer0_mixer(model), torch.tensor([TOKENS[:1]])
    pre = _layer0_preconv(model, ids)[0]
    xbc = F.silu(pre * mixer.conv1d.weight[:, 0, -1] + mixer.conv1d.bias)
    H, P, G, N = mixer.num_heads, mixer.head_dim, mixer.n_groups, mixer.ssm_state_size
    x, b = xbc[: H * P].view(H, P), xbc[H * P : H * P + G * N].view(G, N)
    dt = F.softplus(mixer.in_proj(_layer0_input(model, ids))[0, 0, -H:] + mixer.dt_bias)
    expected = torch.stack([dt[h] * torch.outer(x[h], b[h // (H // G)]) for h in range(H)])
    torch.testing.assert_close(state, expected, rtol=0, atol=1e-5)


@torch.no_grad()
def test_nemotron_h_chunked_prefill_clamps_dt_at_time_step_min_but_decode_does_not(folders):
    """transformers' Nemotron-H mixer passes dt_limit (time_step_min, inf) to its chunked scan
    only; the single-token update never clamps. The fixtures keep dt above time_step_min so
    the two agree; with dt below it they part, and agree again once the clamp is lifted."""
    model = hf.load_transformers(folders["nemotron-h"])
    mixers = [layer.mixer for layer in model.model.layers if layer.block_type == "linear_attention"]
    assert {m.time_step_limit for m in mixers} == {(model.config.time_step_min, float("inf"))}
    for m in mixers:
        m.dt_bias.fill_(-12.0)  # softplus(-12 + proj) ~ 1e-5 < time_step_min = 1e-3
    with pytest.raises(AssertionError):
        hf.reference_run(folders["nemotron-h"], TOKENS, model=model)
    for m in mixers:
        m.time_step_limit = (0.0, float("inf"))
    hf.reference_run(folders["nemotron-h"], TOKENS, model=model)


# --------------------------------------------------------------------------- tokenizer


@pytest.mark.parametrize("name", ["qwen35-text", "lfm2", "granite-h", "nemotron-h"])
def test_tokenizer_and_chat_template(folders, name):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folders[name]))
    ids = tok.apply_chat_template([{"role": "user", "content": "hello world"}], add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert ids and max(ids) < 96
    assert "hello" in tok.decode(ids)
