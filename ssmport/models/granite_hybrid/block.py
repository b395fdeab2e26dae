"""The export form of a Granite-4.0-H layer: the mixer (Mamba-2, from ssmport.models.mamba2,
or attention from ssmport.models.layers) and the shared SwiGLU MLP, each behind its RMSNorm
and scaled by residual_multiplier, batched over the T rows; in the MoE releases the routed
experts of ssmport.models.moe are added to the shared MLP."""

from __future__ import annotations

import torch
from torch import nn

from ssmport.loader.checkpoint import TensorSource
from ssmport.graph import Step
from ssmport.models.granite_hybrid.checkpoints import EMBEDDING, FINAL_NORM, HEAD, attention, layer, moe_names
from ssmport.models.granite_hybrid.config import MAMBA, GraniteHybridConfig
from ssmport.models.granite_hybrid.quant import role
from ssmport.models.layers.attention import AttentionMixer
from ssmport.models.layers.head import ScaledEmbedding, norm_head
from ssmport.models.layers.mamba2_mixer import Mamba2StateMixer
from ssmport.models.layers.mlp import SwiGLU
from ssmport.models.moe import ExpertMixture
from ssmport.ops.norms import rms_norm
from ssmport.quant.plan import WeightBuilder


class GraniteHybridLayer(nn.Module):
    """x + r * mixer(rmsnorm(x)), then x + r * (experts + mlp)(rmsnorm(x)), r = residual_multiplier."""

    def __init__(self, cfg: GraniteHybridConfig, i: int, src: TensorSource, b: WeightBuilder):
        super().__init__()
        p, self.eps, self.r = layer(i), cfg.norm_eps, cfg.residual_multiplier
        vec = lambda n: b.vector(n, src[n], role(n))  # noqa: E731
        self.in_norm, self.mlp_norm = vec(p + "input_layernorm.weight"), vec(p + "post_attention_layernorm.weight")
        if cfg.layer_types[i] == MAMBA:
            self.mixer = Mamba2StateMixer(cfg.mixer, p + "mamba.", src, b, role)
        else:
            self.mixer = AttentionMixer(cfg.attention, attention(cfg, i), src, b)
        self.states = self.mixer.states
        self.mlp = SwiGLU(None, None, p + "shared_mlp.output_linear.weight", src, b, fused=p + "shared_mlp.input_linear.weight")
        self.experts = ExpertMixture(cfg.moe, moe_names(i), src, b) if cfg.num_local_experts else None

    def forward(self, x: torch.Tensor, slices: dict, step: Step):
        out, states = self.mixer(rms_norm(x, self.in_norm, self.eps), slices, step)
        x = x + out * self.r
        h = rms_norm(x, self.mlp_norm, self.eps)
        mlp = self.mlp(h) if self.experts is None else self.experts(h) + self.mlp(h)
        return x + mlp * self.r, states


def build(cfg: GraniteHybridConfig, src: TensorSource, b: WeightBuilder):
    """(embedding, blocks, head). logits_scaling divides the logits; it is folded into the final
    norm's gain (lm_head(w * x̂) / s = lm_head((w / s) * x̂): one per-channel vector, no extra op)."""
    embed = ScaledEmbedding(b.table(EMBEDDING, src[EMBEDDING], role(EMBEDDING)), cfg.embedding_multiplier)
    blocks = [GraniteHybridLayer(cfg, i, src, b) for i in range(cfg.num_layers)]
    gain = src[FINAL_NORM].float() / cfg.logits_scaling
    return embed, blocks, norm_head(src, b, HEAD, FINAL_NORM, cfg.norm_eps, gain=gain)
