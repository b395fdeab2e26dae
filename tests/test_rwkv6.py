"""RWKV-6 (x060): the WKV-6 op's three forms, the reference against BlinkDL's `rwkv` package,
bundles on the Core AI runtime (against the package; prefill against the M=1 loop, decays of
e^-20 per token included), int8keepproj, strict loading, fla's `rwkv6` folders."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from prefill_checks import assert_coreai_prefill_equals_m1_loop, prefill_vs_reference
from rwkv6_files import Dims, blinkdl_state_dict, fla_from_blinkdl, rwkv_package_run, write_pth
from rwkv7_files import write_hf_folder
from ssmport.errors import CheckpointError
from ssmport.exporter.pipeline import export
from ssmport.ops import wkv6
from ssmport.ops.deferred import apply_naive
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.runtime import Runner
from ssmport.loader.resolve import load_checkpoint

TOKENS = [3, 17, 17, 250, 0, 99, 5, 318, 42, 42, 7, 1]
DIMS = Dims()
CHUNK = 2 * wkv6.PAIR_BLOCK  # two pairwise blocks per prefill chunk
FAST = (2.9, 3.1)  # time_decay: -log w = exp(3) ~ 20 per token, on every channel


@pytest.fixture(scope="module")
def pth(tmp_path_factory):
    return write_pth(tmp_path_factory.mktemp("rwkv6") / "x060.pth", blinkdl_state_dict(DIMS, seed=1))


@pytest.fixture(scope="module")
def fast_pth(tmp_path_factory):
    return write_pth(tmp_path_factory.mktemp("rwkv6") / "x060-fast.pth", blinkdl_state_dict(DIMS, seed=2, decay=FAST))


@pytest.fixture(scope="module")
def package(pth):
    return rwkv_package_run(pth, TOKENS)


@pytest.fixture(scope="module")
def bundle(pth, tmp_path_factory):
    return export(str(pth), tmp_path_factory.mktemp("b6"), quant="fp32", gate_steps=6, prefill_chunk=CHUNK, progress=False)


def _stream(T, H, K, V, log_w_mean, seed):
    g = torch.Generator().manual_seed(seed)
    rn = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    log_w = -torch.exp(log_w_mean + rn(T, H, K))
    return rn(H, K, V), rn(T, H, K), log_w, rn(H, K), rn(T, H, K), rn(T, H, V)


@pytest.mark.parametrize("log_w_mean", [-2.0, 3.0, 6.0])  # 3.0: e^-20 per token; 6.0: e^-400
def test_wkv6_decode_and_chunk_match_the_naive_step(log_w_mean):
    """naive (fp64, per head) <-> decode (fp32, deferred update) <-> chunk (fp32) with every
    pairwise block size, a padded tail included: no overflow whatever the decay."""
    T, H, K, V = 32, 3, 8, 5
    S0, r, log_w, u, k, v = _stream(T, H, K, V, log_w_mean, seed=int(log_w_mean) + 10)
    S, ys = S0.clone(), []
    Sd, yd = S0.float(), []
    for t in range(T):
        steps = [wkv6.naive_step(S[h], r[t, h], log_w[t, h], u[h], k[t, h], v[t, h]) for h in range(H)]
        S, y = torch.stack([s for s, _ in steps]), torch.stack([y for _, y in steps])
        ys.append(y)
        y, update = wkv6.decode(Sd, *(x.float() for x in (r[t], log_w[t], u, k[t], v[t])))
        Sd = apply_naive(Sd, update).view(H, K, V)
        yd.append(y)
    Y = torch.stack(ys)
    assert float((torch.stack(yd) - Y).abs().max()) < 1e-4 and float((Sd - S).abs().max()) < 1e-4
    f = lambda x: x.float()  # noqa: E731
    for block in (4, 8, 32):
        Sc, yc = wkv6.chunk(f(S0), f(r), f(log_w), f(u), f(k), f(v), torch.tensor([T]), pair_block=block)
        assert torch.isfinite(yc).all()
        assert float((yc.double() - Y).abs().max()) < 1e-4 and float((Sc.double() - S).abs().max()) < 1e-4
    n = 21  # the first 21 real, the rest padding of random content
    Sc, yc = wkv6.chunk(f(S0), f(r), f(log_w), f(u), f(k), f(v), torch.tensor([n]), pair_block=8)
    S_n = S0.clone()
    for t in range(n):
        S_n = torch.stack([wkv6.naive_step(S_n[h], r[t, h], log_w[t, h], u[h], k[t, h], v[t, h])[0] for h in range(H)])
    assert float((yc[:n].double() - Y[:n]).abs().max()) < 1e-4 and float((Sc.double() - S_n).abs().max()) < 1e-4


def test_reference_matches_rwkv_package_logits_and_states(pth, package):
    model = load_checkpoint(pth)
    assert model.architecture.name == "rwkv6" and model.config.num_heads == DIMS.att // DIMS.head
    ref = model.architecture.reference(model.config, model.weights)
    state = ref.zero_state()
    ours = torch.stack([ref.step(t, state) for t in TOKENS])
    theirs, their_state = package
    assert float((ours - theirs).abs().max()) < 1e-4
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    for i in range(DIMS.layers):  # the package's state list: att_x, wkv [H, K, V], ffn_x per layer
        att_x, wkv, ffn_x = their_state[3 * i : 3 * i + 3]
        assert torch.allclose(state["att_x"][i], att_x, atol=1e-5)
        assert torch.allclose(state["wkv"][i], wkv, atol=1e-4)
        assert torch.allclose(state["ffn_x"][i], ffn_x, atol=1e-5)


def test_export_form_matches_reference_with_attention_wider_than_the_model(tmp_path):
    """dim_att != n_embd (the format allows it; the rwkv package does not run it): the eager
    decode module against the reference, logits and key-major states."""
    d = Dims(width=64, att=96, head=32, ffn=160)
    model = load_checkpoint(write_pth(tmp_path / "wide.pth", blinkdl_state_dict(d, seed=4)))
    arch = model.architecture
    module = arch.build_decode(model.config, model.weights, WeightBuilder(get_recipe("fp32"), arch.keeps_float),
                               torch.float32).eval()  # fmt: skip
    ref = arch.reference(model.config, model.weights)
    state = ref.zero_state()
    with torch.no_grad():
        for t in TOKENS[:6]:
            got = module(torch.tensor([[t]], dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32))[0, 0]
            want = ref.step(t, state)
            assert float((got - want).abs().max()) < 1e-4
    for i in range(d.layers):
        assert torch.allclose(module.recState[i, 0], state["wkv"][i], atol=1e-5)


def test_fp32_bundle_on_coreai_matches_rwkv_package(bundle, package):
    theirs, their_state = package
    with Runner(bundle.path) as runner:
        ours = runner.step_each(TOKENS)
        rec, shift = runner.state("recState"), runner.state("shiftState")
    theirs = theirs.numpy()
    assert ours.shape == theirs.shape == (len(TOKENS), DIMS.vocab)
    assert np.abs(theirs - ours).max() < 2e-3
    assert (theirs.argmax(-1) == ours.argmax(-1)).all()
    for i in range(DIMS.layers):
        assert np.abs(rec[i, 0] - their_state[3 * i + 1].numpy()).max() < 2e-3
        assert np.abs(shift[i, 0, 0] - their_state[3 * i].numpy()).max() < 2e-3
        assert np.abs(shift[i, 0, 1] - their_state[3 * i + 2].numpy()).max() < 2e-3
    assert bundle.manifest.gate.passed


@pytest.mark.parametrize("n", [1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 5])
def test_coreai_prefill_equals_m1_loop(bundle, n):
    assert_coreai_prefill_equals_m1_loop(bundle.path, n, chunk=CHUNK)


def test_prefill_with_e20_decay_per_token(fast_pth, tmp_path):
    """Every channel decays by ~e^-20 per token (the pairwise exponents reach -600 within a
    chunk): eager prefill equals the reference loop, and on the runtime prefill equals the M=1 loop."""
    model = load_checkpoint(fast_pth)
    ref = model.architecture.reference(model.config, model.weights)
    log_w = -torch.exp(ref.att[0]["time_decay"])
    assert float(log_w.max()) < -15
    prefill_vs_reference(model, 21)
    result = export(str(fast_pth), tmp_path, quant="fp32", gate_steps=4, prefill_chunk=CHUNK, progress=False)
    assert_coreai_prefill_equals_m1_loop(result.path, CHUNK + 7, chunk=CHUNK)


def test_int8keepproj_passes_its_gate_and_keeps_the_recurrence_inputs_float(pth, tmp_path):
    result = export(str(pth), tmp_path, quant="int8keepproj", gate_steps=6, prefill_chunk=None, progress=False)
    assert result.manifest.gate.passed, result.gate_headline
    kinds = {e["name"]: e["dtype"] for e in result.manifest.plan_tensors}
    assert kinds["head.weight"] == "int8" and kinds["blocks.0.ffn.key.weight"] == "int8"
    for name in ("att.time_decay_w1", "att.time_decay_w2", "att.time_maa_w1", "att.key.weight", "att.time_faaaa"):
        assert kinds[f"blocks.1.{name}"] != "int8", name


def test_strict_loading_names_keys_and_tells_x060_from_x070(pth, tmp_path, blinkdl_pth):
    sd = torch.load(pth, weights_only=True)
    broken = {k: v for k, v in sd.items() if k != "blocks.1.att.time_faaaa"}
    broken["blocks.0.att.surprise"] = torch.zeros(2)
    broken["blocks.1.ffn.time_maa_r"] = torch.zeros(1, 1, DIMS.width + 1)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(write_pth(tmp_path / "broken.pth", broken))
    message = str(info.value)
    assert "\n" not in message
    for name in ("blocks.1.att.time_faaaa", "blocks.0.att.surprise", "blocks.1.ffn.time_maa_r"):
        assert name in message
    assert load_checkpoint(blinkdl_pth).architecture.name == "rwkv7"  # an x070 file stays RWKV-7's


@pytest.fixture(scope="module")
def fla_folder(pth, tmp_path_factory):
    config, tensors = fla_from_blinkdl(torch.load(pth, weights_only=True), DIMS)
    return write_hf_folder(tmp_path_factory.mktemp("fla6") / "rwkv6-fla", config, tensors)


def test_fla_folder_holds_the_pth_weights_and_its_bundle_computes_the_pth_model(pth, fla_folder, tmp_path):
    """fla's layout of the .pth's weights: the same config (but ln_x's eps: fla's g_norm takes
    norm_eps), every canonical tensor bit-equal, and the fp32 bundle on the Core AI runtime equal
    to the .pth's reference loop run with that eps."""
    ours, theirs = load_checkpoint(fla_folder), load_checkpoint(pth)
    assert ours.architecture.name == "rwkv6"
    assert ours.config.ln_x_eps == 1e-5 != theirs.config.ln_x_eps
    assert ours.config == dataclasses.replace(theirs.config, ln_x_eps=1e-5)
    shapes = ours.architecture.canonical_shapes(ours.config)
    assert all(torch.equal(ours.weights[n], theirs.weights[n]) for n in shapes), "a tensor differs from the .pth's"
    ref = theirs.architecture.reference(ours.config, theirs.weights)
    state = ref.zero_state()
    want = torch.stack([ref.step(t, state) for t in TOKENS]).numpy()
    result = export(str(fla_folder), tmp_path, quant="fp32", gate_steps=4, prefill_chunk=None, progress=False)
    with Runner(result.path) as runner:
        got = runner.step_each(TOKENS)
    assert np.abs(got - want).max() < 2e-3 and (got.argmax(-1) == want.argmax(-1)).all()
    assert result.manifest.gate.passed


@pytest.mark.parametrize("change, expected", [
    ({"expand_k": 0.5}, "key width 48 != value width 96"),
    ({"attn": {"layers": [1], "num_heads": 4}}, "hybrid attention layers"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"num_hidden_layers": 3}, "config.json says 3 layers but the checkpoint holds 2"),
    ({"proj_low_rank_dim": 8}, "model.layers.0.attn.x_proj.0.linear.weight"),
    ({"tensors": "rename"}, "model.layers.1.attn.bonus"),
    ({"tensors": "rwkv-hf"}, "RWKV's own Hugging Face layout"),
])  # fmt: skip
def test_fla_folder_loads_strictly(pth, tmp_path, change, expected):
    config, tensors = fla_from_blinkdl(torch.load(pth, weights_only=True), DIMS)
    how = change.pop("tensors", None)
    if how == "rename":
        tensors["model.layers.1.attn.u"] = tensors.pop("model.layers.1.attn.bonus")
    elif how == "rwkv-hf":  # RWKV's remote-code folders also say model_type rwkv6
        tensors = {"rwkv.embeddings.weight": tensors["model.embeddings.weight"]}
        config["architectures"] = ["Rwkv6ForCausalLM"]
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(write_hf_folder(tmp_path / "f", config | change, tensors))
    assert "\n" not in str(info.value) and expected in str(info.value), str(info.value)
