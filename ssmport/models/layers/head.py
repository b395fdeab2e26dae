"""What every build ends (and some begin) with: the final norm and LM head, the scaled embedding."""

from __future__ import annotations

import torch
from torch import nn

from ssmport.loader.checkpoint import TensorSource
from ssmport.graph import Embedding, NormHead
from ssmport.quant.plan import WeightBuilder
from ssmport.quant.roles import Role


class ScaledEmbedding(Embedding):
    """The embedding rows times embedding_multiplier (in fp32, after the lookup, as transformers)."""

    def __init__(self, table: nn.Parameter, multiplier: float):
        super().__init__(table)
        self.multiplier = multiplier

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(ids) * self.multiplier


def norm_head(src: TensorSource, b: WeightBuilder, head: str, norm: str, eps: float,
              gain: torch.Tensor | None = None, bias: str | None = None) -> NormHead:  # fmt: skip
    """The final norm and the LM head (stored [in, out], logits in the recipe's dtype): an
    RMSNorm of gain `gain` (default: the checkpoint's `norm` as it is), or a LayerNorm with `bias`."""
    weight = b.vector(norm, src[norm] if gain is None else gain, Role.NORM)
    shift = b.vector(bias, src[bias], Role.NORM) if bias else None
    return NormHead(b.matmul(head, src[head].t(), Role.HEAD, out_dtype=b.recipe.logits_dtype), weight, eps, bias=shift)
