"""The export form of a Mamba-2 layer: the pre-norm, the shared Mamba-2 mixer
(ssmport.models.layers.mamba2_mixer, which the hybrids run on their own stacked states) and
the residual, on Mamba-2's own per-layer states."""

from __future__ import annotations

import torch
from torch import nn

from ssmport.loader.checkpoint import TensorSource
from ssmport.graph import Embedding, Step
from ssmport.models.layers.head import norm_head
from ssmport.models.layers.mamba2_mixer import Mamba2Mixer
from ssmport.models.mamba2.config import Mamba2Config
from ssmport.models.mamba2.quant import role
from ssmport.ops.norms import rms_norm
from ssmport.quant.plan import WeightBuilder

CONV_STATE, SSM_STATE = "convState", "ssmState"


class Mamba2Block(nn.Module):
    """One residual layer. States: convState [K, conv_dim] (the last K conv inputs x|B|C, oldest
    first: time-major, the hybrids' and Apple's layout, which the conv reads as it is; transformers'
    and mamba_ssm's cache is its transpose) and ssmState [H, P, N]."""

    states = (CONV_STATE, SSM_STATE)

    def __init__(self, cfg: Mamba2Config, i: int, src: TensorSource, b: WeightBuilder, residual_dtype: torch.dtype):
        super().__init__()
        self.cfg, self.residual_dtype = cfg, residual_dtype
        self.norm_w = b.vector(f"layers.{i}.norm.weight", src[f"layers.{i}.norm.weight"], role(f"layers.{i}.norm.weight"))
        self.mixer = Mamba2Mixer(cfg.mixer, f"layers.{i}.mixer.", src, b, role)

    def forward(self, x: torch.Tensor, slices: dict, step: Step):
        """x [T, D] fp32; rows >= valid_len (prefill) are padding: computed, never stored."""
        conv = slices[CONV_STATE].float()  # [K, conv_dim]: the K inputs, not K-1
        out, new_conv, S = self.mixer(rms_norm(x, self.norm_w, self.cfg.norm_eps), conv, slices[SSM_STATE].float(), step)
        x = x + out
        if self.residual_dtype != torch.float32:
            x = x.to(self.residual_dtype).float()
        return x, {CONV_STATE: new_conv, SSM_STATE: S}


def build_layers(block_class: type[nn.Module]):
    """`build` of a model of Mamba-style residual blocks `block_class(cfg, i, src, b, residual_dtype)`:
    (embedding, blocks, head). residual_in_fp32=False: the checkpoint's own runtime carries the
    residual in its weight dtype, so it is rounded to the recipe's float dtype after each block."""

    def build(cfg, src: TensorSource, b: WeightBuilder):
        embed = Embedding(b.table("embeddings.weight", src["embeddings.weight"], "embedding"))
        residual = torch.float32 if cfg.residual_in_fp32 else b.recipe.float_dtype
        blocks = [block_class(cfg, i, src, b, residual) for i in range(cfg.num_layers)]
        return embed, blocks, norm_head(src, b, "lm_head.weight", "norm_f.weight", cfg.norm_eps)

    return build


build = build_layers(Mamba2Block)
