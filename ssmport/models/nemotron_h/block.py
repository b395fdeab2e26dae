"""The export form of a Nemotron-H layer: RMSNorm, then its pattern's mixer (Mamba-2 from
ssmport.models.mamba2, attention or the relu^2 MLP from ssmport.models.layers), then the
residual add, batched over the T rows. An MLP or MoE layer (ssmport.models.moe) uses no state."""

from __future__ import annotations

import torch
from torch import nn

from ssmport.loader.checkpoint import TensorSource
from ssmport.graph import Embedding, Step
from ssmport.models.layers.attention import AttentionMixer
from ssmport.models.layers.head import norm_head
from ssmport.models.layers.mamba2_mixer import Mamba2StateMixer
from ssmport.models.layers.mlp import ReluSquaredMLP
from ssmport.models.moe import ExpertMixture
from ssmport.models.nemotron_h.checkpoints import EMBEDDING, FINAL_NORM, HEAD, attention, layer, moe_names
from ssmport.models.nemotron_h.config import ATTENTION, MAMBA, MOE, NemotronHConfig
from ssmport.models.nemotron_h.quant import role
from ssmport.ops.norms import rms_norm
from ssmport.quant.plan import WeightBuilder


class NemotronHLayer(nn.Module):
    """x + mixer(rmsnorm(x))."""

    def __init__(self, cfg: NemotronHConfig, i: int, src: TensorSource, b: WeightBuilder):
        super().__init__()
        p, m, self.eps = layer(i), layer(i) + "mixer.", cfg.norm_eps
        self.norm = b.vector(p + "norm.weight", src[p + "norm.weight"], role(p + "norm.weight"))
        kind = cfg.layer_types[i]
        if kind == MAMBA:
            self.mixer = Mamba2StateMixer(cfg.mixer, m, src, b, role)
        elif kind == ATTENTION:
            self.mixer = AttentionMixer(cfg.attention, attention(i), src, b)
        elif kind == MOE:
            self.mixer = ExpertMixture(cfg.moe, moe_names(i), src, b)
        else:
            self.mixer = ReluSquaredMLP(m + "up_proj.weight", m + "down_proj.weight", src, b)
        self.states = getattr(self.mixer, "states", ())

    def forward(self, x: torch.Tensor, slices: dict, step: Step):
        h = rms_norm(x, self.norm, self.eps)
        if not self.states:
            return x + self.mixer(h), {}
        out, states = self.mixer(h, slices, step)
        return x + out, states


def build(cfg: NemotronHConfig, src: TensorSource, b: WeightBuilder):
    embed = Embedding(b.table(EMBEDDING, src[EMBEDDING], role(EMBEDDING)))
    blocks = [NemotronHLayer(cfg, i, src, b) for i in range(cfg.num_layers)]
    return embed, blocks, norm_head(src, b, HEAD, FINAL_NORM, cfg.norm_eps)
