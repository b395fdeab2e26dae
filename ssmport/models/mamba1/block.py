"""The export form of a Mamba-1 / Falcon-Mamba layer: the projections, the conv and the gate
batched over the T rows; the scan from ssmport.ops.selective_scan (decode: the deferred
update; prefill: the blocked pairwise form)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ssmport.loader.checkpoint import TensorSource
from ssmport.graph import Step
from ssmport.models.mamba1.config import Mamba1Config
from ssmport.models.mamba1.quant import role
from ssmport.models.mamba2.block import build_layers
from ssmport.ops import selective_scan
from ssmport.ops.conv import causal_conv
from ssmport.ops.norms import rms_norm
from ssmport.quant.plan import WeightBuilder

CONV_STATE, SSM_STATE = "convState", "ssmState"


class Mamba1Block(nn.Module):
    """One residual layer. States: convState [K, I] (the last K conv inputs, oldest first:
    time-major, which the conv reads as it is; transformers' and mamba_ssm's cache is its
    transpose) and ssmState [I, N]."""

    states = (CONV_STATE, SSM_STATE)

    def __init__(self, cfg: Mamba1Config, i: int, src: TensorSource, b: WeightBuilder, residual_dtype: torch.dtype):
        super().__init__()
        self.cfg, self.residual_dtype, m = cfg, residual_dtype, f"layers.{i}.mixer."
        vec = lambda n, on=True: b.vector(n, src[n], role(n)) if on else None  # noqa: E731  (off: no such bias)
        mat = lambda n: b.matmul(n, src[n].t(), role(n))  # noqa: E731
        self.norm_w = vec(f"layers.{i}.norm.weight")
        self.in_proj, self.in_bias = mat(m + "in_proj.weight"), vec(m + "in_proj.bias", cfg.use_bias)
        self.conv_w, self.conv_b = vec(m + "conv1d.weight"), vec(m + "conv1d.bias", cfg.use_conv_bias)
        self.x_proj, self.dt_proj, self.dt_bias = mat(m + "x_proj.weight"), mat(m + "dt_proj.weight"), vec(m + "dt_proj.bias")
        self.A = b.vector(m + "A_log", -torch.exp(src[m + "A_log"].float()), role(m + "A_log"))  # stored as A = -exp(A_log)
        self.D = vec(m + "D")
        self.out_proj, self.out_bias = mat(m + "out_proj.weight"), vec(m + "out_proj.bias", cfg.use_bias)

    def forward(self, x: torch.Tensor, slices: dict, step: Step):
        """x [T, D] fp32; rows >= valid_len (prefill) are padding: computed, never stored."""
        c = self.cfg
        I, N, K, T = c.intermediate_size, c.state_size, c.conv_kernel, x.shape[0]
        xz = self.in_proj(rms_norm(x, self.norm_w, c.norm_eps))
        if self.in_bias is not None:
            xz = xz + self.in_bias
        xs, z = xz.split([I, I], dim=-1)
        conv = slices[CONV_STATE].float()  # [K, I]: the K inputs, not K-1
        xs, new_conv = causal_conv(conv, xs, self.conv_w.view(I, K).t(), step.valid_len)
        if self.conv_b is not None:
            xs = xs + self.conv_b
        xs = F.silu(xs)
        dt, B, C = self.x_proj(xs).split([c.dt_rank, N, N], dim=-1)
        if c.bcdt_norm_eps is not None:  # Falcon-Mamba
            dt, B, C = (rms_norm(v, None, c.bcdt_norm_eps) for v in (dt, B, C))
        dt = F.softplus(self.dt_proj(dt) + self.dt_bias)  # [T, I]

        # The scan, in fp32 whatever the state's storage dtype.
        u = dt * xs  # [T, I]
        if step.decode:
            y, S = selective_scan.decode(slices[SSM_STATE].float(), dt.view(I), self.A, u.view(I), B.view(N), C.view(N))
            y = y.view(1, I)
        else:
            S, y = selective_scan.chunk(slices[SSM_STATE].float(), dt.view(T, I, 1) * self.A, u, B, C, step.valid_len)
        out = self.out_proj((y + self.D * xs) * F.silu(z))
        if self.out_bias is not None:
            out = out + self.out_bias
        x = x + out
        if self.residual_dtype != torch.float32:
            x = x.to(self.residual_dtype).float()
        return x, {CONV_STATE: new_conv, SSM_STATE: S}


build = build_layers(Mamba1Block)
