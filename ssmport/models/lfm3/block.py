"""The export form of an LFM3 layer: LFM2's layer (ssmport.models.lfm2.block) with the sandwich
norms, its attention layers the shared AttentionMixer with their kind's spec: a sliding
window over the ring states, or full attention over the KV cache."""

from __future__ import annotations

from ssmport.loader.checkpoint import TensorSource
from ssmport.models.layers.attention import AttentionMixer
from ssmport.models.lfm2.block import build as lfm2_build
from ssmport.models.lfm3.checkpoints import attention
from ssmport.models.lfm3.config import Lfm3Config
from ssmport.quant.plan import WeightBuilder


def attention_op(cfg: Lfm3Config, i: int, src: TensorSource, b: WeightBuilder) -> AttentionMixer:
    return AttentionMixer(cfg.attention_of(cfg.layer_types[i]), attention(cfg, i), src, b)


def build(cfg: Lfm3Config, src: TensorSource, b: WeightBuilder):
    return lfm2_build(cfg, src, b, attention_op=attention_op, sandwich=cfg.sandwich_norm)
