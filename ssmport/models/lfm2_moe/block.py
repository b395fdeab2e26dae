"""The export form of an LFM2-MoE layer: LFM2's (ssmport.models.lfm2.block) with the routed
experts of ssmport.models.moe in place of the SwiGLU past the dense layers."""

from __future__ import annotations

from torch import nn

from ssmport.loader.checkpoint import TensorSource
from ssmport.models.lfm2.block import build as lfm2_build
from ssmport.models.lfm2.block import dense_mlp
from ssmport.models.lfm2_moe.checkpoints import moe_names
from ssmport.models.lfm2_moe.config import Lfm2MoeConfig
from ssmport.models.lfm2_moe.quant import role
from ssmport.models.moe import ExpertMixture
from ssmport.quant.plan import WeightBuilder


def mlp(cfg: Lfm2MoeConfig, i: int, src: TensorSource, b: WeightBuilder) -> nn.Module:
    return ExpertMixture(cfg.moe, moe_names(i), src, b) if cfg.is_moe(i) else dense_mlp(cfg, i, src, b)


def build(cfg: Lfm2MoeConfig, src: TensorSource, b: WeightBuilder):
    return lfm2_build(cfg, src, b, mlp, role)
