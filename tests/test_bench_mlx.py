"""The mlx-lm peer (benchmarks/peers_mlx.py): on the suite's RWKV-7 and Mamba-2 folders it
must reproduce ssmport's logits before it is timed, and on each hybrid fixture of
tests/hybrid_files.py it must reproduce transformers' (or be refused, with the reason).

Skipped where mlx / mlx-lm are not installed: they come with the `bench` extra, not `test`
(CI); the suite checks every peer's logits again on every run before it times one."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import hybrid_files as hf  # noqa: E402
import peers_mlx  # noqa: E402
import suite  # noqa: E402

TOKENS = [5, 17, 300, 17, 2, 511, 64, 9]
HYBRID_TOKENS = [5, 17, 30, 17, 2, 51, 64, 9]  # below the fixtures' vocab of 96
FP32_ONLY = 1e-5  # both sides fp32: summation order only (measured <= 3.2e-6 of scale)


def _ssmport_logits(spec: str) -> np.ndarray:
    import ssmport
    from ssmport.gate.torch_runner import TorchRunner

    ref = TorchRunner(ssmport.load_model(spec, synthetic=not Path(spec).exists()), "fp32")
    ref.reset()
    return ref.step_each(TOKENS)


def test_rwkv7_mlx_lm_peer_runs_the_same_weights(tmp_path):
    folder = suite.ensure_mlx_rwkv7_folder("rwkv7-tiny", tmp_path)
    lines, record = suite.mlx_lm_lines(folder, _ssmport_logits("rwkv7-tiny"), TOKENS, warmup=2)
    check = record["agreement"]
    assert check["passed"] and check["top1_agree"] == len(TOKENS) and check["max_rel_logit_delta"] < FP32_ONLY
    assert record["name"].startswith("mlx-lm==") and "rwkv7" in record["name"]
    assert set(lines) == {"mlx_lm_1thread", "mlx_lm_default"}
    assert lines["mlx_lm_1thread"]["cpus"] == 1 and lines["mlx_lm_1thread"]["samples"] == len(TOKENS) - 2


def test_a_grouped_mamba2_is_refused_and_the_record_says_why(tmp_path):
    # mamba2-tiny has 2 groups; mlx-lm 0.32's gated norm spans all channels (one group)
    folder = suite.ensure_mlx_mamba2_folder("mamba2-tiny", tmp_path)
    lines, record = suite.mlx_lm_lines(folder, _ssmport_logits("mamba2-tiny"), TOKENS, warmup=2)
    assert lines == {} and "refused" in record and not record["agreement"]["passed"]
    assert any("2 groups" in cause for cause in record["likely_cause"])


def test_a_one_group_mamba2_agrees(tmp_path):
    """A 1-group Mamba-2 written by transformers' own class, read by ssmport and by mlx-lm."""
    import torch
    from transformers import Mamba2Config, Mamba2ForCausalLM

    config = Mamba2Config(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_heads=4, head_dim=32, state_size=24,
                          n_groups=1, conv_kernel=4, expand=2, tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    model = Mamba2ForCausalLM(config).eval()
    hf._fill_trained_like(model, seed=0)
    model.save_pretrained(str(tmp_path / "hf"))
    view = peers_mlx.mlx_lm_view(tmp_path / "hf", tmp_path / "mlx")
    lines, record = suite.mlx_lm_lines(view, _ssmport_logits(str(tmp_path / "hf")), TOKENS, warmup=6)
    assert record["agreement"]["passed"] and record["agreement"]["max_rel_logit_delta"] < FP32_ONLY
    assert set(lines) == {"mlx_lm_1thread", "mlx_lm_default"}


def test_the_mlx_lm_folder_loads_strictly_or_not_at_all(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = suite.ensure_mlx_rwkv7_folder("rwkv7-tiny", tmp_path)
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.attn.v_lora.lora.2.bias"]
    save_file(tensors, str(folder / "model.safetensors"))
    lines, record = suite.mlx_lm_lines(folder, _ssmport_logits("rwkv7-tiny"), TOKENS, warmup=2)
    assert lines == {} and "did not load" in record["refused"] and "v_lora.lora.2.bias" in record["refused"]


def test_rwkv7_models_mlx_lm_cannot_express_are_refused(tmp_path):
    import dataclasses

    import ssmport

    model = ssmport.load_model("rwkv7-tiny", synthetic=True)
    model.config = dataclasses.replace(model.config, ln_x_eps=32e-5)
    with pytest.raises(peers_mlx.MlxRefusal, match="ln_x eps"):
        peers_mlx.write_rwkv7_folder(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_one_cpu_pins_every_thread_and_restores_them():
    import threading

    before = os.sched_getaffinity(0)
    started = threading.Event()
    stop = threading.Event()
    worker = threading.Thread(target=lambda: (started.set(), stop.wait()))
    worker.start()
    started.wait()
    try:
        with peers_mlx.one_cpu() as cpu:
            masks = [os.sched_getaffinity(int(t)) for t in os.listdir("/proc/self/task")]
            assert len(masks) >= 2 and all(m == {cpu} for m in masks)
        assert all(os.sched_getaffinity(int(t)) == before for t in os.listdir("/proc/self/task"))
    finally:
        stop.set()
        worker.join()


# --------------------------------------------------------------------------- hybrids

PERIODIC = ("linear_attention", "full_attention", "linear_attention", "full_attention")  # mlx-lm: interval 2


def _against_transformers(folder: Path, tmp_path: Path) -> dict:
    """mlx-lm on mlx_lm_view(folder) against transformers' logits: suite.peer_lines's record."""
    reference = hf.reference_logits(folder, HYBRID_TOKENS).numpy()
    peer = peers_mlx.MlxLmPeer(peers_mlx.mlx_lm_view(folder, tmp_path / f"{folder.name}-mlx"))
    try:
        peer.reset()
        got = np.stack([peer.step(t) for t in HYBRID_TOKENS])
    finally:
        peer.close()
    return suite.peer_agreement(reference, got) | {"likely_cause": peer.known_differences}


AGREEING_HYBRIDS = {
    "nemotron-h": lambda p: hf.write_nemotron_h(p, hf.NemotronDims(), seed=5),
    "lfm2": lambda p: hf.write_lfm2(p, hf.Lfm2Dims(), seed=3),
    "lfm2-legacy": lambda p: hf.write_lfm2(p, hf.Lfm2Dims(), seed=3, legacy_keys=True),
    "granite-h-1group": lambda p: hf.write_granite_h(p, hf.GraniteDims(groups=1), seed=4),
    "qwen35-text": lambda p: hf.write_qwen35_text(p, hf.Qwen35Dims(layer_types=PERIODIC, tied=False), seed=1),
    "qwen35-text-tied": lambda p: hf.write_qwen35_text(p, hf.Qwen35Dims(layer_types=PERIODIC, tied=True), seed=2),
    "qwen35-vlm": lambda p: hf.write_qwen35_vlm(p, hf.Qwen35Dims(layer_types=PERIODIC, tied=False), seed=1),
}


@pytest.mark.parametrize("name", AGREEING_HYBRIDS)
def test_mlx_lm_agrees_with_transformers_on_a_hybrid(name, tmp_path):
    check = _against_transformers(AGREEING_HYBRIDS[name](tmp_path / name), tmp_path)
    assert check["passed"] and check["top1_agree"] == len(HYBRID_TOKENS), check
    assert check["max_rel_logit_delta"] < FP32_ONLY and check["likely_cause"] == []


def test_a_grouped_granite_h_disagrees_and_the_cause_is_named(tmp_path):
    check = _against_transformers(hf.write_granite_h(tmp_path / "granite-h", hf.GraniteDims(), seed=4), tmp_path)
    assert not check["passed"] and any("2 groups" in cause for cause in check["likely_cause"])


def test_qwen35_layer_types_mlx_lm_cannot_place_are_refused(tmp_path):
    # the standard fixture's full-attention layers 2 and 4 are no every-n-th pattern
    folder = hf.write_qwen35_text(tmp_path / "qwen35-text", hf.Qwen35Dims(), seed=1)
    with pytest.raises(peers_mlx.MlxRefusal, match="full_attention_interval"):
        peers_mlx.mlx_lm_view(folder, tmp_path / "mlx")
    assert not (tmp_path / "mlx").exists()


def test_an_untied_lfm2_is_refused_at_load(tmp_path):
    folder = hf.write_lfm2(tmp_path / "lfm2", hf.Lfm2Dims(tied=False), seed=3)
    view = peers_mlx.mlx_lm_view(folder, tmp_path / "mlx")
    with pytest.raises(peers_mlx.MlxRefusal, match="lm_head.weight"):
        peers_mlx.MlxLmPeer(view)
    assert peers_mlx.known_differences(json.loads((view / "config.json").read_text()))
