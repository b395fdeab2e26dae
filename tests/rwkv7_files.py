"""Tiny RWKV-7 checkpoints written by the tests, in the real on-disk formats.

Deliberately independent of ssmport's own tables: the key names and shapes below are
written out again from BlinkDL's `RWKV_x070` layout and fla's `convert_from_rwkv7.py`, so a
mistake in ssmport's mapping cannot be mirrored here.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file


@dataclass(frozen=True)
class Dims:
    vocab: int = 320
    width: int = 128
    layers: int = 2
    head: int = 64  # BlinkDL's GroupNorm eps (64e-5) equals fla's head_dim * 1e-5 only here
    ffn: int = 256
    d_w: int = 32
    d_a: int = 32
    d_v: int = 32
    d_g: int = 32


def blinkdl_state_dict(d: Dims, seed: int, layer0_v: bool = True, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """A BlinkDL x070 `.pth` state dict with trained-like value ranges."""
    g = torch.Generator().manual_seed(seed)

    def rn(*shape, std=1.0, mean=0.0):
        return mean + std * torch.randn(*shape, generator=g)

    def ru(*shape, lo=0.0, hi=1.0):
        return lo + (hi - lo) * torch.rand(*shape, generator=g)

    C, H = d.width, d.width // d.head
    sd = {"emb.weight": rn(d.vocab, C)} | norms(rn, C, "blocks.0.ln0")
    for i in range(d.layers):
        b = f"blocks.{i}."
        sd |= norms(rn, C, b + "ln1", b + "ln2")
        a = b + "att."
        for m in "rwkvag":
            sd[f"{a}x_{m}"] = ru(1, 1, C)
        sd[a + "w0"] = ru(1, 1, C, lo=-5, hi=-0.5)
        sd[a + "w1"] = rn(C, d.d_w, std=0.1)
        sd[a + "w2"] = rn(d.d_w, C, std=0.1)
        sd[a + "a0"] = rn(1, 1, C, std=0.5)
        sd[a + "a1"] = rn(C, d.d_a, std=0.1)
        sd[a + "a2"] = rn(d.d_a, C, std=0.1)
        if i > 0 or layer0_v:
            sd[a + "v0"] = rn(1, 1, C, std=0.5, mean=0.5)
            sd[a + "v1"] = rn(C, d.d_v, std=0.1)
            sd[a + "v2"] = rn(d.d_v, C, std=0.1)
        sd[a + "g1"] = rn(C, d.d_g, std=0.1)
        sd[a + "g2"] = rn(d.d_g, C, std=0.1)
        sd[a + "k_k"] = rn(1, 1, C, std=0.1, mean=0.7)
        sd[a + "k_a"] = rn(1, 1, C, std=0.05, mean=1.0)
        sd[a + "r_k"] = rn(H, d.head, std=0.2)
        for proj in ("receptance", "key", "value", "output"):
            sd[f"{a}{proj}.weight"] = rn(C, C, std=1 / math.sqrt(C))
        sd[a + "ln_x.weight"] = rn(C, std=0.1, mean=1)
        sd[a + "ln_x.bias"] = rn(C, std=0.1)
        f = b + "ffn."
        sd[f + "x_k"] = ru(1, 1, C)
        sd[f + "key.weight"] = rn(d.ffn, C, std=1 / math.sqrt(C))
        sd[f + "value.weight"] = rn(C, d.ffn, std=1 / math.sqrt(d.ffn))
    sd |= norms(rn, C, "ln_out")
    sd["head.weight"] = rn(d.vocab, C, std=2 / math.sqrt(C))
    return {k: v.to(dtype).contiguous() for k, v in sd.items()}


def norms(rn, width: int, *names: str) -> dict[str, torch.Tensor]:
    """LayerNorm gains (~1) and biases (~0) of width `width`, drawn name by name from `rn`."""
    out = {}
    for name in names:
        out[f"{name}.weight"] = rn(width, std=0.1, mean=1)
        out[f"{name}.bias"] = rn(width, std=0.1)
    return out


def write_pth(path: Path, sd: dict[str, torch.Tensor]) -> Path:
    torch.save(sd, path)
    return path


def fla_norms_and_ends(sd: dict[str, torch.Tensor], layers: int) -> dict[str, torch.Tensor]:
    """What fla's RWKV folders (rwkv6, rwkv7) name alike: the embedding, the head, and every
    LayerNorm / GroupNorm (ln0 is layer 0's pre_norm, ln_x the attention's g_norm)."""
    out = {"model.embeddings.weight": sd["emb.weight"], "lm_head.weight": sd["head.weight"]}
    pairs = [("blocks.0.ln0", "model.layers.0.pre_norm"), ("ln_out", "model.norm")]
    pairs += [(f"blocks.{i}.{ours}", f"model.layers.{i}.{theirs}") for i in range(layers)
              for ours, theirs in (("ln1", "attn_norm"), ("ln2", "ffn_norm"), ("att.ln_x", "attn.g_norm"))]  # fmt: skip
    return out | {f"{theirs}.{p}": sd[f"{ours}.{p}"] for ours, theirs in pairs for p in ("weight", "bias")}


def fla_from_blinkdl(sd: dict[str, torch.Tensor], d: Dims) -> tuple[dict, dict[str, torch.Tensor]]:
    """fla's RWKV7ForCausalLM layout of a BlinkDL state dict, and its config.json."""
    out = fla_norms_and_ends(sd, d.layers)
    for i in range(d.layers):
        b, h = f"blocks.{i}.", f"model.layers.{i}."
        for m in "rwkvag":
            out[f"{h}attn.x_{m}"] = sd[f"{b}att.x_{m}"]  # stays [1, 1, C]
        for x in "wavg":
            if x == "v" and i == 0:
                continue  # fla's layer 0 has no v_lora
            out[f"{h}attn.{x}_lora.lora.0.weight"] = sd[f"{b}att.{x}1"].t().contiguous()
            out[f"{h}attn.{x}_lora.lora.2.weight"] = sd[f"{b}att.{x}2"].t().contiguous()
            if x != "g":
                out[f"{h}attn.{x}_lora.lora.2.bias"] = sd[f"{b}att.{x}0"].flatten()
        out[f"{h}attn.k_k"] = sd[f"{b}att.k_k"].flatten()
        out[f"{h}attn.k_a"] = sd[f"{b}att.k_a"].flatten()
        out[f"{h}attn.r_k"] = sd[f"{b}att.r_k"]
        for ours, theirs in (("receptance", "r_proj"), ("key", "k_proj"), ("value", "v_proj"), ("output", "o_proj")):
            out[f"{h}attn.{theirs}.weight"] = sd[f"{b}att.{ours}.weight"]
        out[f"{h}ffn.x_k"] = sd[f"{b}ffn.x_k"].flatten()
        out[f"{h}ffn.key.weight"] = sd[f"{b}ffn.key.weight"]
        out[f"{h}ffn.value.weight"] = sd[f"{b}ffn.value.weight"]
    config = {
        "model_type": "rwkv7",
        "architectures": ["RWKV7ForCausalLM"],
        "vocab_size": d.vocab,
        "hidden_size": d.width,
        "num_hidden_layers": d.layers,
        "head_dim": d.head,
        "intermediate_size": d.ffn,
        "decay_low_rank_dim": d.d_w,
        "a_low_rank_dim": d.d_a,
        "v_low_rank_dim": d.d_v,
        "gate_low_rank_dim": d.d_g,
        "hidden_act": "sqrelu",
        "norm_first": True,
        "norm_bias": True,
        "norm_eps": 1e-5,
        "value_dim": [d.width] * d.layers,
        "tie_word_embeddings": False,
        "attn": None,
    }
    return config, {k: v.contiguous() for k, v in out.items()}


def write_hf_folder(folder: Path, config: dict, tensors: dict[str, torch.Tensor], shards: int = 1) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, str(folder / "model.safetensors"))
        return folder
    per = math.ceil(len(names) / shards)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        chunk = {n: tensors[n] for n in names[s * per : (s + 1) * per]}
        save_file(chunk, str(folder / fname))
        weight_map |= {n: fname for n in chunk}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def rwkv_package_logits(pth: Path, tokens: list[int]) -> torch.Tensor:
    """Per-step fp32 logits from BlinkDL's `rwkv` package (`RWKV_x070`), the independent
    reference. It loads `<name>.pth` given `<name>`."""
    os.environ["RWKV_V7_ON"] = "1"
    os.environ.setdefault("RWKV_JIT_ON", "1")
    from rwkv.model import RWKV

    model = RWKV(str(pth.with_suffix("")), "cpu fp32")
    state, rows = None, []
    for t in tokens:
        out, state = model.forward([t], state)
        rows.append(out.float().clone())
    return torch.stack(rows)
