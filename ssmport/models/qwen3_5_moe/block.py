"""The export form of Qwen3.5-MoE: Qwen3.5's blocks (ssmport.models.qwen3_5.block) with the
routed experts and gated shared expert of ssmport.models.moe as every layer's MLP."""

from __future__ import annotations

from ssmport.loader.checkpoint import TensorSource
from ssmport.models.moe import ExpertMixture
from ssmport.models.qwen3_5.block import build as dense_build
from ssmport.models.qwen3_5_moe.checkpoints import moe_names
from ssmport.models.qwen3_5_moe.config import Qwen35MoeConfig
from ssmport.quant.plan import WeightBuilder


def build(cfg: Qwen35MoeConfig, src: TensorSource, b: WeightBuilder):
    return dense_build(cfg, src, b, lambda cfg, i, src, b: ExpertMixture(cfg.moe, moe_names(i), src, b))
