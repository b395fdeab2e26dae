"""Qwen3.5's multi-token-prediction head (`mtp.*`) as the bundle's draft function
(ssmport.models.qwen3_5.mtp) and `--draft mtp`.

The checkpoint: a tiny non-square Qwen3.5 written by transformers' save_pretrained (seeded),
its config.json saying mtp_num_hidden_layers = 1, with the 15 `mtp.*` tensors added to its
safetensors file.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import hybrid_files as hf
from ssmport.errors import CheckpointError

DIMS = hf.Qwen35Dims(tied=False)


def write_mtp_checkpoint(folder: Path, drop: str | None = None, seed: int = 1) -> Path:
    """write_qwen35_text's folder plus the MTP head's tensors (all but `drop`)."""
    hf.write_qwen35_text(folder, DIMS, seed=seed)
    path = folder / "model.safetensors"
    tensors = load_file(str(path)) | hf.qwen35_mtp_tensors(DIMS, seed)
    if drop is not None:
        del tensors[drop]
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})
    return folder


def test_strict_loading_names_a_missing_mtp_tensor(tmp_path):
    from ssmport.loader.resolve import load_model

    missing = "mtp.layers.0.self_attn.k_norm.weight"
    folder = write_mtp_checkpoint(tmp_path / "broken", drop=missing)
    with pytest.raises(CheckpointError, match=r"missing 1: .*mtp\.layers\.0\.self_attn\.k_norm\.weight") as err:
        load_model(str(folder))
    assert "\n" not in str(err.value)


def test_the_head_loads_only_where_declared_and_present(tmp_path):
    from ssmport.loader.resolve import load_model

    with_head = load_model(str(write_mtp_checkpoint(tmp_path / "mtp")))
    assert with_head.config.mtp_layers == 1 and sum(n.startswith("mtp.") for n in with_head.weights) == 15
    plain = load_model(str(hf.write_qwen35_text(tmp_path / "plain", DIMS, seed=1)))  # declared, no tensors
    assert plain.config.mtp_layers == 0 and "mtp_layers" not in plain.config.to_json()
    assert not any(n.startswith("mtp.") for n in plain.weights)


# --------------------------------------------------------------------------- the draft function

K = 4  # --verify K: the draft function takes K rows
CONTEXT = 128
PROMPT = [3, 17, 5, 60, 9, 11, 2, 44, 80, 7, 30, 12]
NEW = 80
MTP_TOL = 2e-3


def _rms1p(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Qwen3.5's zero-centred RMSNorm over the last axis: x / rms(x) * (1 + w)."""
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + DIMS.eps) * (1.0 + w)


def _rope(x: np.ndarray, position: int) -> np.ndarray:
    """Rotate-half RoPE on the first rotary_dim dims of each head's row x [heads, head_dim]."""
    rd = int(DIMS.head_dim * DIMS.partial_rotary)
    angles = position * DIMS.rope_theta ** (-np.arange(0, rd, 2) / rd)
    cos, sin = np.cos(np.concatenate([angles, angles])), np.sin(np.concatenate([angles, angles]))
    head, tail = x[:, :rd], x[:, rd:]
    half = np.concatenate([-head[:, rd // 2 :], head[:, : rd // 2]], axis=1)
    return np.concatenate([head * cos + half * sin, tail], axis=1)


def reference_mtp(w: dict, tokens: list[int], hiddens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The MTP step from its formula, fp32/fp64 numpy, rows at positions 0..n-1 (row t: token
    t+1 and the target's hidden at t): the logits and the head's output hidden of each row."""
    L, H, hd, kvh = "mtp.layers.0.", DIMS.heads, DIMS.head_dim, DIMS.kv_heads
    e = _rms1p(w["model.embed_tokens.weight"][tokens], w["mtp.pre_fc_norm_embedding.weight"])
    h = _rms1p(hiddens, w["mtp.pre_fc_norm_hidden.weight"])
    x = np.concatenate([e, h], axis=1) @ w["mtp.fc.weight"].T  # the embedding's half first
    a = _rms1p(x, w[L + "input_layernorm.weight"])
    qg = (a @ w[L + "self_attn.q_proj.weight"].T).reshape(len(tokens), H, 2, hd)  # per head [query | gate]
    q, gate = qg[:, :, 0], qg[:, :, 1].reshape(len(tokens), H * hd)
    k = (a @ w[L + "self_attn.k_proj.weight"].T).reshape(len(tokens), kvh, hd)
    v = (a @ w[L + "self_attn.v_proj.weight"].T).reshape(len(tokens), kvh, hd)
    q, k = _rms1p(q, w[L + "self_attn.q_norm.weight"]), _rms1p(k, w[L + "self_attn.k_norm.weight"])
    q = np.stack([_rope(q[t], t) for t in range(len(tokens))])
    k = np.stack([_rope(k[t], t) for t in range(len(tokens))])
    o = np.zeros((len(tokens), H, hd))
    for t in range(len(tokens)):
        for head in range(H):
            g = head // (H // kvh)
            s = k[: t + 1, g] @ q[t, head] / np.sqrt(hd)
            p = np.exp(s - s.max())
            o[t, head] = (p / p.sum()) @ v[: t + 1, g]
    x = x + (o.reshape(len(tokens), -1) / (1 + np.exp(-gate))) @ w[L + "self_attn.o_proj.weight"].T
    m = _rms1p(x, w[L + "post_attention_layernorm.weight"])
    up = m @ w[L + "mlp.gate_proj.weight"].T
    x = x + ((up / (1 + np.exp(-up))) * (m @ w[L + "mlp.up_proj.weight"].T)) @ w[L + "mlp.down_proj.weight"].T
    out = _rms1p(x, w["mtp.norm.weight"])
    return out @ w["lm_head.weight"].T, out


@pytest.fixture(scope="module")
def mtp_bundle(tmp_path_factory, export_fn):
    folder = write_mtp_checkpoint(tmp_path_factory.mktemp("mtp") / "qwen35-mtp")
    result = export_fn(folder, tmp_path_factory.mktemp("mtp-bundles"), quant="fp32", gate=False, verify=K,
                       context=CONTEXT, name="qwen35-mtp")  # fmt: skip
    weights = {n: t.double().numpy() for n, t in load_file(str(folder / "model.safetensors")).items()}
    return result.path, weights


def test_the_bundle_carries_the_head_with_its_own_states(mtp_bundle):
    from ssmport.bundle import Bundle

    m = Bundle.open(mtp_bundle[0]).manifest
    assert m.draft.function == "draft" and m.draft.chunk == K
    assert [s.name for s in m.draft.states] == ["mtpKeyCache", "mtpValueCache"]
    assert [s.name for s in m.states] == ["keyCache", "valueCache", "convStates", "recurrentStates"]
    assert [t.name for t in m.main.outputs] == ["logits", "hidden"] == [t.name for t in m.verify.outputs]
    assert "mtp.*" not in m.source.get("skipped_tensors", {}) and m.config["mtp_layers"] == 1
    assert not any("mtp.*" in note for note in m.notes)


def test_the_apple_layout_leaves_the_head_out(tmp_path, export_fn):
    folder = write_mtp_checkpoint(tmp_path / "qwen35-mtp")
    m = export_fn(folder, tmp_path / "out", quant="fp32", gate=False, verify=K, context=CONTEXT, layout="apple").manifest
    assert m.draft is None and [t.name for t in m.main.outputs] == ["logits"]
    assert m.source["skipped_tensors"]["mtp.*"]["tensors"] == 15
    assert any("mtp.*" in note for note in m.notes) and any("not exported in this layout" in n for n in m.notes)


def test_draft_function_matches_the_formula(mtp_bundle):
    """A catch-up call of K rows, then one row more (reading the first call's cache rows),
    against the naive MTP step over random target hiddens."""
    from ssmport.runtime.runner import Runner

    path, w = mtp_bundle
    rng = np.random.default_rng(0)
    tokens = [int(t) for t in rng.integers(0, DIMS.vocab, K + 1)]
    hiddens = rng.standard_normal((K + 1, DIMS.hidden)).astype(np.float32)
    want_logits, want_hidden = reference_mtp(w, tokens, hiddens.astype(np.float64))
    with Runner(path) as r:
        first_logits, first_hidden = r.draft(tokens[:K], hiddens[:K], 0)
        last_logits, last_hidden = r.draft(tokens[K:], hiddens[K:], K)
    got_logits, got_hidden = np.concatenate([first_logits, last_logits]), np.concatenate([first_hidden, last_hidden])
    scale = np.abs(want_logits).max()
    assert np.abs(got_logits - want_logits).max() <= MTP_TOL * scale
    assert np.abs(got_hidden - want_hidden).max() <= MTP_TOL * np.abs(want_hidden).max()
    assert (got_logits.argmax(-1) == want_logits.argmax(-1)).all()
    # the reference is not trivially close: a wrong position for the last row is seen
    wrong, _ = reference_mtp(w, tokens[:K] + [tokens[K]], np.concatenate([hiddens[:K], hiddens[:1]]).astype(np.float64))
    assert np.abs(wrong[-1] - want_logits[-1]).max() > 10 * MTP_TOL * scale


def test_greedy_with_mtp_drafts_is_plain_decoding(mtp_bundle):
    from ssmport.drafters import MTPDrafter
    from ssmport.runtime.runner import Runner
    from ssmport.runtime.speculative import SpeculativeDecoder

    path, _ = mtp_bundle
    with Runner(path) as r:
        plain = list(r.generate(PROMPT, NEW))
        r.reset()
        full = SpeculativeDecoder(r, MTPDrafter(r, adaptive=False))  # drafts every round: rejections everywhere
        assert list(full.generate(PROMPT, NEW)) == plain
        r.reset()
        adaptive = SpeculativeDecoder(r, MTPDrafter(r))
        assert list(adaptive.generate(PROMPT, NEW)) == plain
    assert full.stats.drafted > full.stats.accepted and full.stats.verify_calls > NEW // 2
    # a head whose drafts never hold stops drafting: no more target calls than plain decoding
    assert adaptive.stats.target_calls <= NEW and adaptive.stats.drafted < full.stats.drafted
    print(f"random MTP weights: {full.stats.accepted}/{full.stats.drafted} drafts accepted drafting every round, "
          f"{adaptive.stats.accepted}/{adaptive.stats.drafted} with the adaptive length")  # fmt: skip


def _bigram_head(w: dict, sequence: list[int]) -> dict[str, torch.Tensor]:
    """MTP weights that predict well: the layer silenced (o_proj and down_proj zero, so it adds
    nothing), fc reading the embedding half only, solved by least squares so that token v's
    normalised embedding lands on lm_head's row of the token the target most often emits after
    v in `sequence`. The head then drafts the target's bigram continuation."""
    followers: dict[int, Counter] = {}
    for a, b in zip(sequence, sequence[1:]):
        followers.setdefault(a, Counter())[b] += 1
    seen = sorted(followers)
    E = w["model.embed_tokens.weight"][seen]
    E = E / np.sqrt((E * E).mean(-1, keepdims=True) + DIMS.eps)
    Z = w["lm_head.weight"][[followers[v].most_common(1)[0][0] for v in seen]]
    W_e = np.linalg.lstsq(E, Z, rcond=None)[0].T  # W_e @ e_v ~ z_v
    L = "mtp.layers.0."
    return {"mtp.fc.weight": torch.tensor(np.concatenate([W_e, np.zeros_like(W_e)], axis=1), dtype=torch.float32),
            "mtp.norm.weight": torch.zeros(DIMS.hidden), "mtp.pre_fc_norm_embedding.weight": torch.zeros(DIMS.hidden),
            L + "self_attn.o_proj.weight": torch.zeros(DIMS.hidden, DIMS.heads * DIMS.head_dim),
            L + "mlp.down_proj.weight": torch.zeros(DIMS.hidden, DIMS.ffn)}  # fmt: skip


@pytest.fixture(scope="module")
def useful_bundle(mtp_bundle, tmp_path_factory, export_fn):
    """The same target with a head that predicts its continuation; (path, plain greedy ids)."""
    from ssmport.runtime.runner import Runner

    path, w = mtp_bundle
    with Runner(path) as r:
        plain = list(r.generate(PROMPT, NEW))
    folder = write_mtp_checkpoint(tmp_path_factory.mktemp("mtp-useful") / "qwen35-mtp-useful")
    tensors = load_file(str(folder / "model.safetensors")) | _bigram_head(w, PROMPT + plain)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    result = export_fn(folder, tmp_path_factory.mktemp("mtp-useful-bundles"), quant="fp32", gate=False, verify=K,
                       context=CONTEXT, name="qwen35-mtp-useful")  # fmt: skip
    return result.path, plain


def test_a_head_that_predicts_well_saves_target_calls_losslessly(useful_bundle, capsys):
    from ssmport.cli.main import main

    path, plain = useful_bundle
    ids = ",".join(map(str, PROMPT))
    assert main(["generate", str(path), "--tokens", ids, "-n", str(NEW), "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert main(["generate", str(path), "--tokens", ids, "-n", str(NEW), "--json", "--draft", "mtp"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert alone["ids"] == spec["ids"] == plain  # the head only changes what is checked
    assert alone["target_calls"] == NEW and spec["draft"] == "mtp"
    assert spec["verify_calls"] + spec["main_calls"] == spec["target_calls"]
    print(f"bigram MTP head: {spec['accepted']}/{spec['drafted']} drafts accepted, {spec['target_calls']} target calls "
          f"for {NEW} tokens")  # fmt: skip
    assert spec["drafted"] > spec["accepted"] >= spec["drafted"] // 2  # rejections, and mostly right
    assert spec["target_calls"] <= 0.65 * NEW  # measured: 47 of 80 (33 of 58 drafts kept)
