"""The LFM2-MoE reference: LFM2's (ssmport.models.lfm2.reference), with each MoE layer's MLP the
plain loop over the token's chosen experts (ssmport.models.moe.moe_naive). The experts each
layer chose at each step are kept in `chosen` ([(layer, [experts])] in call order)."""

from __future__ import annotations

import torch

from ssmport.models.lfm2.reference import Lfm2Reference
from ssmport.models.lfm2_moe.checkpoints import canonical_shapes, moe_names
from ssmport.models.moe import RoutedReference


class Lfm2MoeReference(RoutedReference, Lfm2Reference):
    shapes = staticmethod(canonical_shapes)

    def _mlp(self, i: int, y: torch.Tensor) -> torch.Tensor:
        return self.routed(i, self.cfg.moe, moe_names(i), y) if self.cfg.is_moe(i) else super()._mlp(i, y)
