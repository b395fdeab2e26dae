"""Mamba-1 and Falcon-Mamba: the selective-scan op's forms against each other, ssmport's reference
loop, decode and prefill modules against transformers' MambaForCausalLM / FalconMambaForCausalLM
(their pure-torch paths on CPU), fp32 bundles on the Core AI runtime, strict loading of the
transformers and mamba_ssm layouts, config refusals, routing beside Mamba-2, presets, quant plan."""

from __future__ import annotations

import json
import math
import re
import shutil

import numpy as np
import pytest
import torch

from ir_checks import graph_texts
from mamba1_files import FALCON, MAMBA, transformers_logits, transformers_step_logits, write_mamba_ssm_folder, write_transformers_folder
from prefill_checks import LENGTHS, CHUNK, assert_coreai_prefill_equals_m1_loop, padded_outputs_agree, prefill_vs_reference
from ssmport.errors import CheckpointError, SsmportError
from ssmport.exporter.convert import convert
from ssmport.ops import selective_scan
from ssmport.ops.deferred import apply_naive
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.runtime import Runner
from ssmport.loader.resolve import load_checkpoint, load_model
from ssmport.gate.torch_runner import TorchRunner

TOKENS = [1, 5, 77, 3, 3, 150, 9, 0, 12, 44, 44, 101, 7, 2, 159, 30]
GEOMETRIES = {"mamba": MAMBA, "falcon": FALCON}  # tied K4 auto-rank; untied K3 R5 biases, dt/B/C norms


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("m1")
    return {name: write_transformers_folder(root / name, g, seed=11) for name, g in GEOMETRIES.items()}


@pytest.fixture(scope="module")
def bundles(folders, tmp_path_factory, export_fn):
    out = tmp_path_factory.mktemp("m1b")
    return {name: export_fn(f, out, quant="fp32", gate_steps=6, prefill_chunk=CHUNK) for name, f in folders.items()}


def reference_logits(folder, tokens) -> torch.Tensor:
    model = load_checkpoint(folder)
    ref = model.architecture.reference(model.config, model.weights)
    state = ref.zero_state()
    return torch.stack([ref.step(t, state) for t in tokens])


def close(ours, theirs, rel=2e-5) -> None:
    assert float((ours - theirs).abs().max()) <= rel * max(1.0, float(theirs.abs().max()))
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


# --- the op ----------------------------------------------------------------------------------
@pytest.mark.parametrize("T,valid,speed", [(8, 8, 1.0), (8, 3, 1.0), (48, 41, 1.0), (7, 7, 1.0), (64, 60, 50.0)],
                         ids=["one-block", "padded", "six-blocks", "odd-T", "e^-400-per-token"])  # fmt: skip
def test_scan_chunk_equals_step_loop(T, valid, speed):
    """Both chunk forms vs the token loop; `speed` 50 drives decays to ~e^-400 per token, where
    a factorised exp(cum) exp(-cum) form overflows fp32."""
    g = torch.Generator().manual_seed(T + valid)
    I, N = 6, 5  # I != N
    h0, A = torch.randn(I, N, generator=g), -16 * speed * torch.rand(I, N, generator=g)
    dt, x = 0.5 * torch.rand(T, I, generator=g), torch.randn(T, I, generator=g)
    B, C = torch.randn(T, N, generator=g), torch.randn(T, N, generator=g)
    log_decay, u = dt[:, :, None] * A, dt * x
    want_h, want_y = selective_scan.scan_naive(h0, log_decay, u, B, C, valid)
    for form in (selective_scan.chunk, selective_scan.chunk_pairwise):
        got_h, got_y = form(h0, log_decay, u, B, C, torch.tensor([valid], dtype=torch.int32))
        torch.testing.assert_close(got_h, want_h, atol=2e-6, rtol=1e-5)
        torch.testing.assert_close(got_y, want_y, atol=1e-5, rtol=1e-5)
    h, ys = h0, []
    for t in range(valid):  # the naive step itself
        h, y = selective_scan.naive_step(h, x[t], dt[t], A, B[t], C[t])
        ys.append(y)
    torch.testing.assert_close(torch.stack(ys), want_y[:valid], atol=1e-6, rtol=1e-6)


def test_scan_decode_equals_step():
    g = torch.Generator().manual_seed(0)
    I, N = 6, 5
    h, A = torch.randn(I, N, generator=g), -4 * torch.rand(I, N, generator=g)
    dt, x, B, C = torch.rand(I, generator=g), torch.randn(I, generator=g), torch.randn(N, generator=g), torch.randn(N, generator=g)
    want_h, want_y = selective_scan.naive_step(h, x, dt, A, B, C)
    y, update = selective_scan.decode(h, dt, A, dt * x, B, C)
    torch.testing.assert_close(y, want_y)
    torch.testing.assert_close(apply_naive(h, update), want_h)


def test_decode_graph_stacks_dt_not_the_decay():
    """The deferred update stacks each layer's dt [I] (an `Exp` decay), not its decay [I, N]:
    no concat of the decode graph builds a tensor the state's size, and one exp covers every
    layer's (the stack of the layers' A is a stack of constants, which the converter folds)."""
    model = load_model("mamba1-tiny")
    c = model.config
    builder = WeightBuilder(get_recipe("fp32"), model.architecture.keeps_float)
    text = graph_texts(convert(model, builder, torch.float32, prefill_chunk=None).program)["main"]
    concats = re.findall(r"= coreai\.concat [^\n]*-> tensor<([\dx]+)xf32>", text)
    assert len(concats) >= 3 and all(math.prod(map(int, s.split("x"))) < c.num_layers * c.intermediate_size * c.state_size for s in concats)
    assert len(re.findall(rf"= coreai\.exp [^\n]*-> tensor<{c.num_layers}x1x{c.intermediate_size}x{c.state_size}xf32>", text)) == 1


# --- against transformers ----------------------------------------------------------------------
@pytest.mark.parametrize("name", GEOMETRIES)
def test_reference_matches_transformers(folders, name):
    close(reference_logits(folders[name], TOKENS), transformers_logits(folders[name], TOKENS))


@pytest.mark.parametrize("name", GEOMETRIES)
def test_decode_module_and_states_match_transformers_cache(folders, name):
    model = load_checkpoint(folders[name])
    runner = TorchRunner(model, "fp32")
    ours = torch.from_numpy(runner.step_each(TOKENS))
    theirs, cache = transformers_step_logits(folders[name], TOKENS)
    close(ours, theirs)
    # transformers' cache: conv [I, K] (the last K inputs; ssmport's is time-major, its transpose), ssm [I, N]
    for i in range(GEOMETRIES[name].layers):
        torch.testing.assert_close(runner.module.convState[i, 0].t(), cache.get_conv_state(i, state_idx=0)[0])
        torch.testing.assert_close(runner.module.ssmState[i, 0], cache.get_recurrent_state(i, state_idx=0)[0])


@pytest.mark.parametrize("name", GEOMETRIES)
def test_fp32_bundle_matches_transformers(bundles, folders, name):
    assert bundles[name].manifest.gate.passed
    with Runner(bundles[name].path) as runner:
        ours = runner.step_each(TOKENS)
    theirs = transformers_logits(folders[name], TOKENS).numpy()
    assert np.abs(ours - theirs).max() <= 2e-3
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


# --- prefill ----------------------------------------------------------------------------------
@pytest.mark.parametrize("n", LENGTHS)
def test_prefill_module_matches_reference_loop(folders, n):
    module, state = prefill_vs_reference(load_checkpoint(folders["falcon"]), n)
    for i in range(FALCON.layers):
        assert torch.allclose(module.convState[i, 0].t(), state["conv"][i], atol=1e-5)
        assert torch.allclose(module.ssmState[i, 0], state["ssm"][i], atol=1e-5)


def test_padding_never_reaches_the_state(folders):
    padded_outputs_agree(load_checkpoint(folders["mamba"]), [5, 9, 11])


@pytest.mark.parametrize("name,n", [("falcon", n) for n in LENGTHS] + [("mamba", CHUNK + 1)])
def test_coreai_prefill_equals_m1_loop(bundles, name, n):
    assert_coreai_prefill_equals_m1_loop(bundles[name].path, n)


def test_int8keepproj_passes_its_gate(folders, tmp_path, export_fn):
    result = export_fn(folders["mamba"], tmp_path, quant="int8keepproj", gate_steps=4, prefill_chunk=None)
    assert result.manifest.gate.passed


def test_quant_plan_keeps_the_scan_float(folders):
    model = load_checkpoint(folders["falcon"])
    builder = WeightBuilder(get_recipe("int8keepproj"), model.architecture.keeps_float)
    model.architecture.build_decode(model.config, model.weights, builder, torch.float32)
    dtypes = {e["name"]: e["dtype"] for e in builder.plan_json()}
    assert dtypes["lm_head.weight"] == "int8"
    for i in range(FALCON.layers):
        m = f"layers.{i}.mixer."
        for proj in ("in_proj", "x_proj", "dt_proj", "out_proj"):
            assert dtypes[m + proj + ".weight"] == "float16", proj
        for vec in ("A_log", "D", "conv1d.weight", "dt_proj.bias", "in_proj.bias"):
            assert dtypes[m + vec] == "float32", vec


# --- loading ----------------------------------------------------------------------------------
def test_mamba_ssm_folder_matches_transformers(folders, tmp_path):
    """state-spaces layout: mamba_ssm config (ssm_cfg {}), `backbone.embedding.weight`, .bin."""
    ssm = write_mamba_ssm_folder(tmp_path / "ssm", folders["mamba"], vocab_unpadded=157)
    model = load_checkpoint(ssm)
    assert model.architecture.name == "mamba1" and model.config.vocab_size == MAMBA.vocab
    close(reference_logits(ssm, TOKENS), transformers_logits(folders["mamba"], TOKENS))


def test_mamba_ssm_configs_route_by_layer(folders, tmp_path):
    """Neither family's config.json has a model_type in mamba_ssm: ssm_cfg.layer tells them apart."""
    from mamba2_files import Geometry, write_mamba_ssm_folder as write_mamba2_ssm

    assert load_checkpoint(write_mamba2_ssm(tmp_path / "m2", Geometry(groups=1), 1, 160)).architecture.name == "mamba2"
    ssm = write_mamba_ssm_folder(tmp_path / "m1", folders["mamba"], vocab_unpadded=160)
    cfg = json.loads((ssm / "config.json").read_text())
    (ssm / "config.json").write_text(json.dumps(cfg | {"ssm_cfg": {"layer": "Mamba1", "d_state": MAMBA.state}}))
    assert load_checkpoint(ssm).architecture.name == "mamba1"
    from ssmport.architectures import get_architecture

    bare = {"d_model": 768, "n_layer": 24, "vocab_size": 50277}  # state-spaces/mamba-130m's: no ssm_cfg at all
    assert get_architecture("mamba1").matches_hf_config(bare) and not get_architecture("mamba2").matches_hf_config(bare)


def test_strict_loading_names_every_problem(folders, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = shutil.copytree(folders["falcon"], tmp_path / "broken")
    tensors = load_file(folder / "model.safetensors")
    tensors.pop("backbone.layers.1.mixer.x_proj.weight")
    tensors["backbone.layers.0.mixer.b_layernorm.weight"] = torch.ones(FALCON.state)
    tensors["backbone.layers.0.mixer.A_log"] = tensors["backbone.layers.0.mixer.A_log"].t().contiguous()
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(folder)
    msg = str(err.value)
    assert "missing 1: backbone.layers.1.mixer.x_proj.weight" in msg
    assert "unexpected 1: backbone.layers.0.mixer.b_layernorm.weight" in msg
    assert "misshaped" in msg and "backbone.layers.0.mixer.A_log" in msg


@pytest.mark.parametrize(
    "change,message",
    [({"hidden_act": "gelu"}, "hidden_act"), ({"intermediate_size": 100}, "intermediate_size=100 is not expand"),
     ({"time_step_rank": 6}, "misshaped .*x_proj.weight"), ({"tie_word_embeddings": False}, "missing 1: lm_head.weight"),
     ({"num_hidden_layers": 3}, "says 3 layers")],
)  # fmt: skip
def test_config_problems_are_named(folders, tmp_path, change, message):
    folder = shutil.copytree(folders["mamba"], tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg | change))
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(folder)


@pytest.mark.parametrize("change,message", [({"d_intermediate": 64}, "d_intermediate"), ({"rms_norm": False}, "LayerNorm")])
def test_unsupported_mamba_ssm_configs_are_named(folders, tmp_path, change, message):
    ssm = write_mamba_ssm_folder(tmp_path / "ssm", folders["mamba"], vocab_unpadded=160)
    cfg = json.loads((ssm / "config.json").read_text())
    (ssm / "config.json").write_text(json.dumps(cfg | change))
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(ssm)


def test_presets():
    sizes = {"130m": (24, 768), "370m": (48, 1024), "790m": (48, 1536), "1.4b": (48, 2048), "2.8b": (64, 2560)}
    released = {f"mamba-{s}{hf}": dims for s, dims in sizes.items() for hf in ("", "-hf")} | {"falcon-mamba-7b": (64, 4096)}
    for name, (layers, width) in released.items():
        c = load_model(name, synthetic=True).config
        assert c.vocab_size == (65024 if name.startswith("falcon") else 50280)
        assert (c.num_layers, c.hidden_size, c.intermediate_size, c.state_size, c.dt_rank) == (layers, width, 2 * width, 16, width // 16)
        assert (c.bcdt_norm_eps is not None) == name.startswith("falcon")
        with pytest.raises(SsmportError, match="not in the Hugging Face cache"):
            load_model(name)  # offline in the tests: a released preset downloads by default
