"""The Qwen3.5-MoE reference: Qwen3.5's (ssmport.models.qwen3_5.reference) with every MLP the
plain loop over the token's chosen experts plus the gated shared expert (ssmport.models.moe
.moe_naive). The experts each layer chose at each step are kept in `chosen` ([(layer, [experts])])."""

from __future__ import annotations

import torch

from ssmport.models.moe import moe_naive
from ssmport.models.qwen3_5.reference import Qwen35Reference
from ssmport.models.qwen3_5_moe.checkpoints import canonical_shapes, moe_names


class Qwen35MoeReference(Qwen35Reference):
    shapes = staticmethod(canonical_shapes)

    def __init__(self, cfg, weights):
        super().__init__(cfg, weights)
        self.chosen: list[tuple[int, list[int]]] = []

    def _mlp(self, i: int, h: torch.Tensor) -> torch.Tensor:
        out, experts = moe_naive(self.cfg.moe, moe_names(i), self.w, h)
        self.chosen.append((i, experts))
        return out
