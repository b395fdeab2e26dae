"""The Qwen3.5-MoE reference: Qwen3.5's (ssmport.models.qwen3_5.reference) with every MLP the
plain loop over the token's chosen experts plus the gated shared expert (ssmport.models.moe
.moe_naive). The experts each layer chose at each step are kept in `chosen` ([(layer, [experts])])."""

from __future__ import annotations

import torch

from ssmport.models.moe import RoutedReference
from ssmport.models.qwen3_5.reference import Qwen35Reference
from ssmport.models.qwen3_5_moe.checkpoints import canonical_shapes, moe_names


class Qwen35MoeReference(RoutedReference, Qwen35Reference):
    shapes = staticmethod(canonical_shapes)

    def _mlp(self, i: int, h: torch.Tensor) -> torch.Tensor:
        return self.routed(i, self.cfg.moe, moe_names(i), h)
