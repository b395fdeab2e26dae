"""Normalisations, all over the last dimension, written with x*x (this runtime's `pow` is slow
and not exact: 0.1% of values came out 1 ulp off in a one-op graph)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ssmport.ops import composite


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight (no weight: the bare normalisation). With the
    rms_norm composite chosen (ssmport.ops.composite), coreai-torch's RMSNorm when it has a weight."""
    if weight is not None and composite.enabled("rms_norm"):
        return composite.rms_norm(x, weight, eps)
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight


def rms_norm_naive(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def grouped_rms_norm(x: torch.Tensor, weight: torch.Tensor, groups: int, eps: float) -> torch.Tensor:
    """RMSNorm of each of `groups` equal parts of the last dimension, then one gain [D]."""
    *lead, d = x.shape
    return rms_norm(x.view(*lead, groups, d // groups), None, eps).view(*lead, d) * weight


def grouped_rms_norm_naive(x: torch.Tensor, weight: torch.Tensor, groups: int, eps: float) -> torch.Tensor:
    parts = [rms_norm_naive(p, None, eps) for p in x.chunk(groups, dim=-1)]
    return torch.cat(parts, dim=-1) * weight


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def group_norm(y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm of each group y [..., G, D] (no affine per group), then the affine over the
    flattened [..., G*D] (RWKV-7's `ln_x`, a GroupNorm with one group per head)."""
    return normalize_last(y, eps).reshape(*y.shape[:-2], -1) * weight + bias


def normalize_last(y: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm over the last dimension without an affine: (y - mean) / sqrt(var + eps)
    (a group norm whose caller applies the affine in its own shape)."""
    centered = y - y.mean(dim=-1, keepdim=True)
    var = (centered * centered).mean(dim=-1, keepdim=True)
    return centered * torch.rsqrt(var + eps)


def group_norm_naive(y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    *lead, groups, d = y.shape
    flat = y.reshape(-1, groups * d)
    return F.group_norm(flat, groups, weight, bias, eps).view(*lead, groups * d)


def l2_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) (fla's in-kernel q/k normalisation)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def l2_normalize_naive(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def unit_normalize(x: torch.Tensor) -> torch.Tensor:
    """x / max(||x||, 1e-12) (torch's F.normalize; RWKV-7's removal key)."""
    return F.normalize(x, dim=-1)


def unit_normalize_naive(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def gated_output(y: torch.Tensor, gate: torch.Tensor, norm, order: str) -> torch.Tensor:
    """y and the gate silu(z) through the output norm in `order` (a Mamba-2 MixerSpec.gated_norm): "gate_first"
    norm(y * gate), "norm_first" norm(y) * gate, "none" y * gate."""
    if order == "gate_first":
        return norm(y * gate)
    return (norm(y) if order == "norm_first" else y) * gate
