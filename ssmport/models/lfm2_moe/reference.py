"""The LFM2-MoE reference: LFM2's (ssmport.models.lfm2.reference), with each MoE layer's MLP the
plain loop over the token's chosen experts (ssmport.models.moe.moe_naive). The experts each
layer chose at each step are kept in `chosen` ([(layer, [experts])] in call order)."""

from __future__ import annotations

import torch

from ssmport.models.lfm2.reference import Lfm2Reference
from ssmport.models.lfm2_moe.checkpoints import canonical_shapes, moe_names
from ssmport.models.moe import moe_naive


class Lfm2MoeReference(Lfm2Reference):
    shapes = staticmethod(canonical_shapes)

    def __init__(self, cfg, weights):
        super().__init__(cfg, weights)
        self.chosen: list[tuple[int, list[int]]] = []

    def _mlp(self, i: int, y: torch.Tensor) -> torch.Tensor:
        if not self.cfg.is_moe(i):
            return super()._mlp(i, y)
        out, experts = moe_naive(self.cfg.moe, moe_names(i), self.w, y)
        self.chosen.append((i, experts))
        return out
