"""The MLPs the families share: SwiGLU and relu^2."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ssmport.loader.checkpoint import TensorSource
from ssmport.quant.plan import WeightBuilder
from ssmport.quant.roles import Role


class SwiGLU(nn.Module):
    """down(silu(gate(h)) * up(h)), gate and up fused in one [C, 2F] matmul."""

    def __init__(self, gate: str, up: str, down: str, src: TensorSource, b: WeightBuilder, fused: str | None = None):
        """`fused`: the name of a checkpoint tensor that already holds [gate; up] (Granite's
        input_linear), instead of separate `gate` and `up` tensors."""
        super().__init__()
        weight = src[fused] if fused else torch.cat([src[gate], src[up]])
        self.size = weight.shape[0] // 2
        self.gate_up = b.matmul(fused or f"{{{gate},{up}}}", weight.t(), Role.FFN)
        self.down = b.matmul(down, src[down].t(), Role.FFN)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_up(h).split([self.size, self.size], dim=-1)
        return self.down(F.silu(g) * u)


class ReluSquaredMLP(nn.Module):
    """down(relu(up(h))^2) (Nemotron-H's MLP, RWKV-7's channel mix without the shift)."""

    def __init__(self, up: str, down: str, src: TensorSource, b: WeightBuilder):
        super().__init__()
        self.up = b.matmul(up, src[up].t(), Role.FFN)
        self.down = b.matmul(down, src[down].t(), Role.FFN)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        a = torch.relu(self.up(h))
        return self.down(a * a)
