"""benchmarks/suite.py's helpers: model selection, and that a peer is timed only when it
computes what ssmport computes (the Mamba-2 transformers peer on mamba2-tiny, and a corrupted
copy of its checkpoint, which must be refused). The mlx-lm peer: tests/test_bench_mlx.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import suite  # noqa: E402

TOKENS = [5, 17, 300, 17, 2, 511, 64, 9]


def test_models_accept_spaces_and_commas_once_each():
    assert suite.parse_models(["mamba2-tiny,rwkv7-tiny", "gated-deltanet-tiny", "rwkv7-tiny"]) == [
        "mamba2-tiny",
        "rwkv7-tiny",
        "gated-deltanet-tiny",
    ]
    with pytest.raises(SystemExit, match="unknown preset.*mamba3-tiny"):
        suite.parse_models(["mamba2-tiny,mamba3-tiny"])


def test_default_models_cover_every_landed_architecture():
    from ssmport.architectures import presets

    known = presets()
    assert {known[n].architecture for n in suite.DEFAULT_MODELS} == {"rwkv7", "mamba2", "gated_deltanet"}
    # every architecture either has a peer or a recorded reason for having none, and so for mlx-lm
    assert all((a in suite.PEERS) != (a in suite.NO_PEER) for a in ("rwkv7", "mamba2", "gated_deltanet"))
    assert all((a in suite.MLX_LM_FOLDERS) != (a in suite.NO_MLX_LM) for a in ("rwkv7", "mamba2", "gated_deltanet"))


def test_without_mlx_the_mlx_lm_line_is_skipped_with_its_reason(monkeypatch, tmp_path):
    for module in ("mlx", "mlx.core", "mlx_lm"):
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    record = suite.prepare_mlx_lm("rwkv7", "rwkv7-tiny", tmp_path)
    assert "not importable" in record["none"] and list(tmp_path.iterdir()) == []
    assert suite.mlx_lm_lines(record, np.zeros((8, 4)), TOKENS, warmup=2) == ({}, record)


def test_peer_agreement_is_relative_to_the_logit_scale():
    ref = np.random.default_rng(0).normal(0, 5, size=(4, 32)).astype(np.float32)
    assert suite.peer_agreement(ref, ref + 1e-4)["passed"]
    off = suite.peer_agreement(ref, ref[::-1].copy())
    assert not off["passed"] and off["max_rel_logit_delta"] > suite.PEER_MAX_REL_DELTA


def _ssmport_logits(preset, tokens: list[int] = TOKENS) -> np.ndarray:
    """ssmport's fp32 torch module on a preset's synthetic weights (or a LoadedModel)."""
    import ssmport
    from ssmport.gate.torch_runner import TorchRunner

    model = ssmport.load_model(preset, synthetic=True) if isinstance(preset, str) else preset
    ref = TorchRunner(model, "fp32")
    ref.reset()
    return ref.step_each(tokens)


def test_transformers_mamba2_peer_runs_the_same_weights(tmp_path):
    folder = suite.ensure_mamba2_folder("mamba2-tiny", tmp_path)
    peer = suite.TransformersMamba2Peer(folder)
    try:
        lines, record = suite.peer_lines(peer, _ssmport_logits("mamba2-tiny"), TOKENS, warmup=2)
    finally:
        peer.close()
    assert record["agreement"]["passed"] and record["agreement"]["top1_agree"] == len(TOKENS)
    assert record["agreement"]["max_rel_logit_delta"] < 1e-5  # fp32 both sides: summation order only
    assert set(lines) == {"peer_1thread", "peer_default"} and lines["peer_1thread"]["samples"] == len(TOKENS) - 2


def test_a_peer_on_other_weights_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = suite.ensure_mamba2_folder("mamba2-tiny", tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["lm_head.weight"] = -tensors["lm_head.weight"]  # every logit's sign flipped
    save_file(tensors, str(folder / "model.safetensors"))
    peer = suite.TransformersMamba2Peer(folder)
    try:
        lines, record = suite.peer_lines(peer, _ssmport_logits("mamba2-tiny"), TOKENS, warmup=2)
    finally:
        peer.close()
    assert lines == {} and "refused" in record and not record["agreement"]["passed"]


def test_the_mamba2_folder_loads_strictly_or_not_at_all(tmp_path):
    folder = suite.ensure_mamba2_folder("mamba2-tiny", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 3}))
    with pytest.raises(SystemExit, match="did not load strictly"):
        suite.TransformersMamba2Peer(folder)


def test_the_olmo_hybrid_peer_is_transformers_on_the_same_weights():
    """OLMo-Hybrid's peer line: transformers' OlmoHybridForCausalLM (hybrid_speed's peer) agrees first."""
    assert suite.PEERS["olmo_hybrid"] == (suite.hybrid_preset, suite.open_transformers_hybrid)
    tokens = [t % 256 for t in TOKENS]  # olmo-hybrid-tiny's vocabulary
    peer = suite.open_transformers_hybrid("olmo-hybrid-tiny")
    try:
        lines, record = suite.peer_lines(peer, _ssmport_logits("olmo-hybrid-tiny", tokens), tokens, warmup=2)
    finally:
        peer.close()
    assert record["agreement"]["passed"] and record["agreement"]["top1_agree"] == len(tokens)
    assert "OlmoHybridForCausalLM" in record["name"] and set(lines) == {"peer_1thread", "peer_default"}


@pytest.mark.parametrize("preset, arch, vocab, cls", [("lfm2-moe-tiny", "lfm2_moe", 512, "Lfm2MoeForCausalLM"),
                                                        ("qwen3.5-tiny", "qwen3_5", 256, "Qwen3_5ForCausalLM"),
                                                        ("lfm3-tiny", "lfm3", 512, "Lfm3ForCausalLM")])
def test_the_moe_qwen35_and_lfm3_peers_are_transformers_on_the_same_weights(monkeypatch, preset, arch, vocab, cls):
    """LFM2-MoE's peer (its expert stacks assembled from ssmport's per-expert tensors on the
    meta device), Qwen3.5's and LFM3's (its sliding window wrapped: 8 tokens, window 8, and a
    proportional RoPE on full attention) agree with ssmport's torch module; --one-thread times
    1 thread only."""
    assert suite.PEERS[arch] == (suite.hybrid_preset, suite.open_transformers_hybrid)
    monkeypatch.setattr(suite, "ONE_THREAD_ONLY", True)
    tokens = [t % vocab for t in TOKENS]
    peer = suite.open_transformers_hybrid(preset)
    try:
        lines, record = suite.peer_lines(peer, _ssmport_logits(preset, tokens), tokens, warmup=2)
    finally:
        peer.close()
    assert record["agreement"]["passed"] and record["agreement"]["top1_agree"] == len(tokens)
    assert cls in record["name"] and set(lines) == {"peer_1thread"}


def _recurrent_gemma_square():
    """recurrentgemma-tiny with lru_width == hidden_size (as every release has it) and a window
    of 3, so 8 tokens wrap its attention ring."""
    import dataclasses

    import ssmport

    model = ssmport.load_model("recurrentgemma-tiny", synthetic=True)
    config = dataclasses.replace(model.config, lru_width=model.config.hidden_size, window=3)
    return dataclasses.replace(model, config=config, weights=model.architecture.synthetic_weights(config, 0))


def test_the_recurrent_gemma_peer_is_transformers_with_its_own_cache(monkeypatch):
    """RecurrentGemmaForCausalLM returns no cache: the peer starts each sequence itself, and
    agrees with ssmport's torch module token by token (again after a reset)."""
    import hybrid_speed

    assert suite.PEERS["recurrent_gemma"] == (suite.hybrid_preset, suite.open_transformers_hybrid)
    monkeypatch.setattr(suite, "ONE_THREAD_ONLY", True)
    model = _recurrent_gemma_square()
    peer = hybrid_speed.open_peer(model)
    try:
        lines, record = suite.peer_lines(peer, _ssmport_logits(model), TOKENS, warmup=2)
    finally:
        peer.close()
    assert record["agreement"]["passed"] and record["agreement"]["top1_agree"] == len(TOKENS)
    assert "RecurrentGemmaForCausalLM" in record["name"] and set(lines) == {"peer_1thread"}


def test_the_recurrent_gemma_peer_refuses_a_narrower_recurrence():
    """transformers' cached path is wrong where lru_width != hidden_size (recurrentgemma-tiny's
    80 != 96): no line rather than a wrong one."""
    with pytest.raises(suite.PeerRefusal, match="needs lru_width == hidden_size .this model: 80 != 96."):
        suite.open_transformers_hybrid("recurrentgemma-tiny")


def test_the_rwkv6_peer_refuses_attention_wider_than_the_model(tmp_path):
    """rwkv6-tiny has dim_att 128 != n_embd 96, which the rwkv package's x060 class cannot run:
    refused before the package is imported, its reason recorded (the line is left out)."""
    pth = suite.ensure_blinkdl_pth("rwkv6-tiny", tmp_path)
    with pytest.raises(suite.PeerRefusal, match="dim_att 128, n_embd 96"):
        suite.RwkvX060Peer(pth)


def test_the_rwkv6_peer_is_the_rwkv_package_on_the_same_weights(tmp_path):
    """The x060 peer on a square tiny .pth, in a process of its own (the package serves one RWKV
    generation per process): it agrees with ssmport's torch module before it is timed."""
    import subprocess

    tokens = [t % 320 for t in TOKENS]  # the test file's vocabulary (rwkv6_files.Dims)
    script = f"""
import sys
sys.path[:0] = {[str(Path(__file__).parent), str(Path(suite.__file__).parent)]!r}
import suite
from rwkv6_files import Dims, blinkdl_state_dict, write_pth
import ssmport
from ssmport.gate.torch_runner import TorchRunner
pth = write_pth(__import__("pathlib").Path({str(tmp_path)!r}) / "x060.pth", blinkdl_state_dict(Dims(), seed=3))
ref = TorchRunner(ssmport.load_model(str(pth)), "fp32")
ref.reset()
logits = ref.step_each({tokens!r})
peer = suite.RwkvX060Peer(pth)
lines, record = suite.peer_lines(peer, logits, {tokens!r}, warmup=2)
assert record["agreement"]["passed"] and record["agreement"]["top1_agree"] == {len(tokens)}, record
assert "RWKV_x060" in record["name"] and set(lines) == {{"peer_1thread", "peer_default"}}, (record, lines)
print("ok", record["agreement"]["max_rel_logit_delta"])
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]
