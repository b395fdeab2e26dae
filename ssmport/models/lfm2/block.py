"""The export form of an LFM2 layer: the operator (the gated short conv, or attention from
ssmport.models.layers) and the SwiGLU MLP, each behind its RMSNorm, batched over the T rows.
The conv has no recurrence beyond its window, so decode and prefill are the same code."""

from __future__ import annotations

import torch
from torch import nn

from ssmport.loader.checkpoint import TensorSource
from ssmport.graph import Embedding, Step
from ssmport.models.layers import CONV_STATES
from ssmport.models.layers.attention import AttentionMixer
from ssmport.models.layers.head import norm_head
from ssmport.models.layers.mlp import SwiGLU
from ssmport.models.lfm2.checkpoints import CONV_WEIGHT, EMBEDDING, HEAD, attention, layer
from ssmport.models.lfm2.config import CONV, Lfm2Config
from ssmport.models.lfm2.quant import role
from ssmport.ops.conv import causal_conv
from ssmport.ops.norms import rms_norm
from ssmport.quant.plan import WeightBuilder


class GatedShortConv(nn.Module):
    """B | C | x = in_proj(h); the depthwise causal conv of B*x over the last K inputs
    (convStates [K, H], time-major); out_proj(C * conv). No activation anywhere."""

    states = (CONV_STATES,)

    def __init__(self, cfg: Lfm2Config, i: int, src: TensorSource, b: WeightBuilder):
        super().__init__()
        self.cfg, c = cfg, layer(i) + "conv."
        self.in_proj = b.matmul(c + "in_proj.weight", src[c + "in_proj.weight"].t(), role(c + "in_proj.weight"))
        name = layer(i) + CONV_WEIGHT
        self.conv_w = b.vector(name, src[name].t().contiguous(), role(name))  # [K, H]: tap j multiplies row t-K+1+j
        self.out_proj = b.matmul(c + "out_proj.weight", src[c + "out_proj.weight"].t(), role(c + "out_proj.weight"))
        if cfg.conv_bias:
            self.in_bias, self.conv_b, self.out_bias = (b.vector(c + n, src[c + n], role(c + n))
                                                        for n in ("in_proj.bias", "conv.bias", "out_proj.bias"))  # fmt: skip

    def forward(self, h: torch.Tensor, slices: dict, step: Step):
        H = self.cfg.hidden_size
        BCx = self.in_proj(h)
        if self.cfg.conv_bias:
            BCx = BCx + self.in_bias
        B, C, x = BCx.split([H, H, H], dim=-1)
        y, window = causal_conv(slices[CONV_STATES].float(), B * x, self.conv_w, step.valid_len)
        if self.cfg.conv_bias:
            y = y + self.conv_b
        out = self.out_proj(C * y)
        if self.cfg.conv_bias:
            out = out + self.out_bias
        return out, {CONV_STATES: window}


class Lfm2Layer(nn.Module):
    """x + op(rmsnorm(x)), then x + mlp(rmsnorm(x)). Its states are its operator's. With
    `sandwich` (LFM3), op's and mlp's outputs are RMS-normed again before the residual."""

    def __init__(self, cfg: Lfm2Config, i: int, src: TensorSource, b: WeightBuilder, mlp: nn.Module,
                 attention_op=None, sandwich: bool = False):  # fmt: skip
        super().__init__()
        p, self.eps, self.sandwich = layer(i), cfg.norm_eps, sandwich
        vec = lambda n: b.vector(n, src[n], role(n))  # noqa: E731
        self.op_norm, self.ffn_norm = vec(p + "operator_norm.weight"), vec(p + "ffn_norm.weight")
        if sandwich:
            self.post_op_norm, self.post_ffn_norm = vec(p + "post_operator_norm.weight"), vec(p + "post_ffn_norm.weight")
        if cfg.layer_types[i] == CONV:
            self.op = GatedShortConv(cfg, i, src, b)
        else:
            self.op = attention_op if attention_op is not None else AttentionMixer(cfg.attention, attention(i), src, b)
        self.states = self.op.states
        self.mlp = mlp

    def forward(self, x: torch.Tensor, slices: dict, step: Step):
        out, states = self.op(rms_norm(x, self.op_norm, self.eps), slices, step)
        x = x + (rms_norm(out, self.post_op_norm, self.eps) if self.sandwich else out)
        y = self.mlp(rms_norm(x, self.ffn_norm, self.eps))
        return x + (rms_norm(y, self.post_ffn_norm, self.eps) if self.sandwich else y), states


def dense_mlp(cfg: Lfm2Config, i: int, src: TensorSource, b: WeightBuilder) -> nn.Module:
    f = layer(i) + "feed_forward."
    return SwiGLU(f + "w1.weight", f + "w3.weight", f + "w2.weight", src, b)


def build(cfg: Lfm2Config, src: TensorSource, b: WeightBuilder, mlp=dense_mlp, role=role, attention_op=None,
          sandwich: bool = False):  # fmt: skip
    """`mlp(cfg, i, src, b)`: layer i's MLP (LFM2-MoE's routed experts past its dense layers);
    `attention_op(cfg, i, src, b)`: attention layer i's operator (LFM3's per-kind specs and
    names); `sandwich`: LFM3's post norms."""
    embed = Embedding(b.table(EMBEDDING, src[EMBEDDING], role(EMBEDDING)))

    def op(i: int):
        return attention_op(cfg, i, src, b) if attention_op is not None and cfg.layer_types[i] != CONV else None

    blocks = [Lfm2Layer(cfg, i, src, b, mlp(cfg, i, src, b), op(i), sandwich) for i in range(cfg.num_layers)]
    return embed, blocks, norm_head(src, b, HEAD, "model.embedding_norm.weight", cfg.norm_eps)
