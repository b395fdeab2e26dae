"""Tiny fla Gated DeltaNet folders written by the tests, and an independent reference.

Deliberately independent of ssmport's own tables: the config keys, weight names and shapes
below are written out again from fla's `GatedDeltaNetConfig`, `GatedDeltaNet` layer,
`ShortConvolution` and `GatedMLP`, so a mistake in ssmport's mapping cannot be mirrored here.

The reference runs a whole sequence with transformers' Qwen3-Next pure-torch functions (the
chunked gated delta rule, its causal conv and its gated RMSNorm): a different algorithm from
ssmport's one-token step. transformers swaps those functions for fla's Triton kernels when
`fla` is importable, so the reference refuses to run if it is.
"""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from rwkv7_files import write_hf_folder


@dataclass(frozen=True)
class GDNDims:
    vocab: int = 384
    hidden: int = 96
    layers: int = 2
    heads: int = 2  # query/key heads
    head_dim: int = 16  # dk
    v_heads: int = 4  # value heads (GVA: 2 per q/k head)
    expand_v: float = 1.5  # dv = 24 != dk
    conv: int = 4
    hidden_ratio: int = 2
    use_gate: bool = True
    allow_neg_eigval: bool = False
    tie: bool = False
    conv_bias: bool = False  # fla's model never builds biased convs; other writers might

    @property
    def dv(self) -> int:
        return int(self.head_dim * self.expand_v)

    @property
    def ffn(self) -> int:  # fla GatedMLP with intermediate_size null
        return 256 * math.ceil(int(self.hidden * self.hidden_ratio * 2 / 3) / 256)


def fla_gdn_tensors(d: GDNDims, seed: int) -> dict[str, torch.Tensor]:
    """fla GatedDeltaNetForCausalLM state dict with trained-like ranges."""
    g = torch.Generator().manual_seed(seed)

    def rn(*shape, std=1.0, mean=0.0):
        return mean + std * torch.randn(*shape, generator=g)

    C, Kd, Vd, HV = d.hidden, d.heads * d.head_dim, d.v_heads * d.dv, d.v_heads
    sd = {"model.embeddings.weight": rn(d.vocab, C)}
    for i in range(d.layers):
        L = f"model.layers.{i}."
        sd[L + "attn_norm.weight"] = rn(C, std=0.1, mean=1)
        sd[L + "mlp_norm.weight"] = rn(C, std=0.1, mean=1)
        A = L + "attn."
        sd[A + "q_proj.weight"] = rn(Kd, C, std=C**-0.5)
        sd[A + "k_proj.weight"] = rn(Kd, C, std=C**-0.5)
        sd[A + "v_proj.weight"] = rn(Vd, C, std=C**-0.5)
        sd[A + "a_proj.weight"] = rn(HV, C, std=C**-0.5)
        sd[A + "b_proj.weight"] = rn(HV, C, std=C**-0.5)
        sd[A + "A_log"] = torch.empty(HV).uniform_(0.5, 16, generator=g).log()
        dt = torch.exp(torch.rand(HV, generator=g) * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
        sd[A + "dt_bias"] = dt + torch.log(-torch.expm1(-dt))
        for name, width in (("q_conv1d", Kd), ("k_conv1d", Kd), ("v_conv1d", Vd)):
            sd[f"{A}{name}.weight"] = rn(width, 1, d.conv, std=0.5)
            if d.conv_bias:
                sd[f"{A}{name}.bias"] = rn(width, std=0.1)
        if d.use_gate:
            sd[A + "g_proj.weight"] = rn(Vd, C, std=C**-0.5)
        sd[A + "o_norm.weight"] = rn(d.dv, std=0.1, mean=1)
        sd[A + "o_proj.weight"] = rn(C, Vd, std=Vd**-0.5)
        M = L + "mlp."
        sd[M + "gate_proj.weight"] = rn(d.ffn, C, std=C**-0.5)
        sd[M + "up_proj.weight"] = rn(d.ffn, C, std=C**-0.5)
        sd[M + "down_proj.weight"] = rn(C, d.ffn, std=d.ffn**-0.5)
    sd["model.norm.weight"] = rn(C, std=0.1, mean=1)
    if not d.tie:
        sd["lm_head.weight"] = rn(d.vocab, C, std=2 * C**-0.5)
    return sd


def fla_gdn_config(d: GDNDims) -> dict:
    """config.json as fla's GatedDeltaNetConfig.save_pretrained writes it."""
    return {
        "architectures": ["GatedDeltaNetForCausalLM"],
        "model_type": "gated_deltanet",
        "attn": None,
        "attn_mode": "chunk",
        "hidden_size": d.hidden,
        "expand_v": d.expand_v,
        "use_gate": d.use_gate,
        "use_short_conv": True,
        "allow_neg_eigval": d.allow_neg_eigval,
        "conv_size": d.conv,
        "head_dim": d.head_dim,
        "num_heads": d.heads,
        "num_v_heads": d.v_heads,
        "max_position_embeddings": 2048,
        "hidden_ratio": d.hidden_ratio,
        "intermediate_size": None,
        "hidden_act": "swish",
        "num_hidden_layers": d.layers,
        "norm_eps": 1e-6,
        "use_cache": True,
        "initializer_range": 0.02,
        "fuse_norm": True,
        "fuse_swiglu": True,
        "fuse_cross_entropy": True,
        "fuse_linear_cross_entropy": False,
        "use_l2warp": False,
        "vocab_size": d.vocab,
        "attnres_block_size": None,
        "tie_word_embeddings": d.tie,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": None,
        "torch_dtype": "float32",
        "transformers_version": "4.57.1",
    }


def write_gdn_folder(folder: Path, d: GDNDims, seed: int, dtype=torch.float32, shards: int = 1) -> Path:
    tensors = {k: v.to(dtype).contiguous() for k, v in fla_gdn_tensors(d, seed).items()}
    return write_hf_folder(folder, fla_gdn_config(d), tensors, shards)


def _read_folder(folder: Path) -> dict[str, torch.Tensor]:
    sd: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        sd |= load_file(str(f))
    return {k: v.float() for k, v in sd.items()}


@torch.no_grad()
def transformers_reference_logits(folder: Path, tokens: list[int], chunked: bool = True) -> torch.Tensor:
    """fp32 logits [T, V] of an fla GDN folder over the whole sequence, via transformers'
    Qwen3-Next torch functions (`chunked`: the chunk-parallel form, else the token loop)."""
    assert importlib.util.find_spec("fla") is None, "fla is importable: transformers would use its Triton kernels"
    from transformers.models.qwen3_next import modeling_qwen3_next as q3n

    cfg = json.loads((folder / "config.json").read_text())
    sd = _read_folder(folder)
    C, H, dk = cfg["hidden_size"], cfg["num_heads"], cfg["head_dim"]
    HV = cfg.get("num_v_heads") or H
    dv = int(dk * cfg["expand_v"])
    eps = cfg["norm_eps"]
    T = len(tokens)
    rms = lambda x, w: F.rms_norm(x, (x.shape[-1],), w, eps)  # noqa: E731

    x = sd["model.embeddings.weight"][torch.tensor(tokens)][None]  # [1, T, C]
    for i in range(cfg["num_hidden_layers"]):
        L, A, M = f"model.layers.{i}.", f"model.layers.{i}.attn.", f"model.layers.{i}.mlp."
        h = rms(x, sd[L + "attn_norm.weight"])

        def conv(name):
            pre = (h @ sd[f"{A}{name}_proj.weight"].T).transpose(1, 2)  # [1, D, T]
            w = sd[f"{A}{name}_conv1d.weight"].squeeze(1)
            return q3n.causal_conv1d_fn(pre, w, sd.get(f"{A}{name}_conv1d.bias"), activation="silu").transpose(1, 2)

        q, k, v = conv("q").view(1, T, H, dk), conv("k").view(1, T, H, dk), conv("v").view(1, T, HV, dv)
        beta = torch.sigmoid(h @ sd[A + "b_proj.weight"].T) * (2.0 if cfg["allow_neg_eigval"] else 1.0)
        g = -sd[A + "A_log"].exp() * F.softplus(h @ sd[A + "a_proj.weight"].T + sd[A + "dt_bias"])
        rule = q3n.torch_chunk_gated_delta_rule if chunked else q3n.torch_recurrent_gated_delta_rule
        o, _ = rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)  # [1, T, HV, dv]
        if cfg["use_gate"]:
            norm = q3n.Qwen3NextRMSNormGated(dv, eps=eps)
            norm.weight.data.copy_(sd[A + "o_norm.weight"])
            o = norm(o, (h @ sd[A + "g_proj.weight"].T).view(1, T, HV, dv))
        else:
            o = rms(o, sd[A + "o_norm.weight"])
        x = x + o.reshape(1, T, HV * dv) @ sd[A + "o_proj.weight"].T
        h = rms(x, sd[L + "mlp_norm.weight"])
        x = x + (F.silu(h @ sd[M + "gate_proj.weight"].T) * (h @ sd[M + "up_proj.weight"].T)) @ sd[M + "down_proj.weight"].T
    x = rms(x, sd["model.norm.weight"])
    head = sd.get("lm_head.weight", sd["model.embeddings.weight"])
    return (x @ head.T)[0]
