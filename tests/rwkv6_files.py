"""Tiny RWKV-6 (x060) checkpoints written by the tests, in BlinkDL's on-disk format, and the
`rwkv` package run on them (the independent reference).

Deliberately independent of ssmport's own tables: the key names and shapes below are written
out again from BlinkDL's `RWKV_x060` layout (RWKV-LM v6 `model.py`), so a mistake in
ssmport's mapping cannot be mirrored here.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from rwkv7_files import fla_norms_and_ends, norms


@dataclass(frozen=True)
class Dims:
    vocab: int = 320
    width: int = 96  # n_embd
    att: int = 96  # dim_att; the rwkv package needs it = n_embd (it splits heads by n_embd)
    head: int = 32
    layers: int = 2
    ffn: int = 224
    d_mix: int = 16  # TIME_MIX_EXTRA_DIM
    d_decay: int = 24  # TIME_DECAY_EXTRA_DIM


def blinkdl_state_dict(d: Dims, seed: int, decay: tuple[float, float] = (-5.0, 1.0)) -> dict[str, torch.Tensor]:
    """An x060 `.pth` state dict with trained-like value ranges. `decay`: the range of
    time_decay, the log of -log(w): (2.9, 3.1) makes every channel decay by ~e^-20 per token."""
    g = torch.Generator().manual_seed(seed)

    def rn(*shape, std=1.0, mean=0.0):
        return mean + std * torch.randn(*shape, generator=g)

    def ru(*shape, lo=0.0, hi=1.0):
        return lo + (hi - lo) * torch.rand(*shape, generator=g)

    C, A, H = d.width, d.att, d.att // d.head
    sd = {"emb.weight": rn(d.vocab, C)} | norms(rn, C, "blocks.0.ln0")
    for i in range(d.layers):
        b = f"blocks.{i}."
        sd |= norms(rn, C, b + "ln1", b + "ln2")
        a = b + "att."
        for m in "xwkvrg":
            sd[f"{a}time_maa_{m}"] = ru(1, 1, C)
        sd[a + "time_maa_w1"] = rn(C, 5 * d.d_mix, std=0.1)
        sd[a + "time_maa_w2"] = rn(5, d.d_mix, C, std=0.1)
        sd[a + "time_decay"] = ru(1, 1, A, lo=decay[0], hi=decay[1])
        sd[a + "time_decay_w1"] = rn(C, d.d_decay, std=0.1)
        sd[a + "time_decay_w2"] = rn(d.d_decay, A, std=0.1)
        sd[a + "time_faaaa"] = rn(H, d.head, std=0.5)
        for proj in ("receptance", "key", "value", "gate"):
            sd[f"{a}{proj}.weight"] = rn(A, C, std=1 / math.sqrt(C))
        sd[a + "output.weight"] = rn(C, A, std=1 / math.sqrt(A))
        sd |= norms(rn, A, a + "ln_x")
        f = b + "ffn."
        sd[f + "time_maa_k"] = ru(1, 1, C)
        sd[f + "time_maa_r"] = ru(1, 1, C)
        sd[f + "key.weight"] = rn(d.ffn, C, std=1 / math.sqrt(C))
        sd[f + "receptance.weight"] = rn(C, C, std=1 / math.sqrt(C))
        sd[f + "value.weight"] = rn(C, d.ffn, std=1 / math.sqrt(d.ffn))
    sd |= norms(rn, C, "ln_out")
    sd["head.weight"] = rn(d.vocab, C, std=2 / math.sqrt(C))
    return {k: v.contiguous() for k, v in sd.items()}


def write_pth(path: Path, sd: dict[str, torch.Tensor]) -> Path:
    torch.save(sd, path)
    return path


@contextlib.contextmanager
def _x060_environment():
    """The `rwkv` package picks its model class from RWKV_V7_ON when rwkv.model is imported,
    and reads RWKV_CUDA_ON when a v6 model is built: both set for a CPU x060 run, and put back."""
    keys = ("RWKV_V7_ON", "RWKV_JIT_ON", "RWKV_CUDA_ON")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.pop("RWKV_V7_ON", None)
    os.environ.update(RWKV_JIT_ON="0", RWKV_CUDA_ON="0")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@functools.cache
def _rwkv_model_module():
    """A private copy of rwkv.model loaded for x060: the shared `rwkv.model` may already be the
    RWKV-7 one (tests/rwkv7_files.py imports it with RWKV_V7_ON=1), and must stay so."""
    spec = importlib.util.spec_from_file_location("_rwkv_model_x060", importlib.util.find_spec("rwkv.model").origin)
    module = importlib.util.module_from_spec(spec)
    with _x060_environment():
        spec.loader.exec_module(module)
    return module


def rwkv_package_run(pth: Path, tokens: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Per-step fp32 logits from BlinkDL's `rwkv` package (its v6.0 path), and its final state
    list: per layer [att_x [C], wkv [H, K, V], ffn_x [C]]. It loads `<name>.pth` given `<name>`."""
    module = _rwkv_model_module()
    with _x060_environment():
        model = module.RWKV(str(pth.with_suffix("")), "cpu fp32")
        assert model.version == 6.0, model.version
        state, rows = None, []
        for t in tokens:
            out, state = model.forward([t], state)
            rows.append(out.float().clone())
    return torch.stack(rows), [s.clone() for s in state]


def fla_from_blinkdl(sd: dict[str, torch.Tensor], d: Dims) -> tuple[dict, dict[str, torch.Tensor]]:
    """fla's RWKV6ForCausalLM layout of an x060 state dict, and its config.json, as fla's
    `utils/convert_from_rwkv6.py` and `fla/layers/rwkv6.py` lay them out: the five mixes in
    fla's order r, w, k, v, g (x_bias rows, the column groups of x_proj.0 and x_proj.2)."""
    C = d.width
    out = fla_norms_and_ends(sd, d.layers)
    for i in range(d.layers):
        b, h = f"blocks.{i}.", f"model.layers.{i}."
        a = b + "att."
        out[h + "attn.x_proj.0.mu"] = sd[a + "time_maa_x"].view(-1)
        ww, wk, wv, wr, wg = sd[a + "time_maa_w1"].view(C, 5, -1).unbind(1)  # BlinkDL's groups: w, k, v, r, g
        out[h + "attn.x_proj.0.linear.weight"] = torch.cat((wr, ww, wk, wv, wg), -1).t()
        ww, wk, wv, wr, wg = sd[a + "time_maa_w2"].unbind(0)
        out[h + "attn.x_proj.2.weight"] = torch.cat((wr, ww, wk, wv, wg), 0).t()
        out[h + "attn.x_bias"] = torch.stack([sd[a + f"time_maa_{m}"].view(-1) for m in "rwkvg"])
        for proj in ("receptance", "key", "value", "gate"):
            out[f"{h}attn.{proj[0]}_proj.linear.weight"] = sd[f"{a}{proj}.weight"]
        out[h + "attn.w_proj.linear.lora.0.weight"] = sd[a + "time_decay_w1"].t()
        out[h + "attn.w_proj.linear.lora.2.weight"] = sd[a + "time_decay_w2"].t()
        out[h + "attn.w_proj.linear.lora.2.bias"] = sd[a + "time_decay"].view(-1)
        out[h + "attn.bonus"] = sd[a + "time_faaaa"]
        out[h + "attn.o_proj.weight"] = sd[a + "output.weight"]
        f = b + "ffn."
        out[h + "ffn.key.mu"] = sd[f + "time_maa_k"].view(-1)
        out[h + "ffn.key.linear.weight"] = sd[f + "key.weight"]
        out[h + "ffn.receptance.mu"] = sd[f + "time_maa_r"].view(-1)
        out[h + "ffn.receptance.linear.weight"] = sd[f + "receptance.weight"]
        out[h + "ffn.value.weight"] = sd[f + "value.weight"]
    config = {  # every key fla's RWKV6Config saves, with this model's values
        "model_type": "rwkv6", "architectures": ["RWKV6ForCausalLM"], "attn_mode": "chunk",
        "hidden_size": C, "expand_k": d.att / C, "expand_v": d.att / C, "hidden_ratio": 3.5, "intermediate_size": d.ffn,
        "num_hidden_layers": d.layers, "num_heads": d.att // d.head, "proj_low_rank_dim": d.d_mix,
        "gate_low_rank_dim": d.d_decay, "hidden_act": "sqrelu", "max_position_embeddings": 2048, "norm_first": True,
        "norm_bias": True, "norm_eps": 1e-5, "attn": None, "use_cache": True, "pad_token_id": None, "bos_token_id": 1,
        "eos_token_id": 2, "tie_word_embeddings": False, "initializer_range": 0.02, "fuse_norm": True,
        "fuse_cross_entropy": True, "fuse_linear_cross_entropy": False, "use_l2warp": False, "vocab_size": d.vocab,
    }  # fmt: skip
    return config, {k: v.contiguous() for k, v in out.items()}
