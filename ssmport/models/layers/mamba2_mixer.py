"""The Mamba-2 mixer (everything between the pre-norm and the residual add) that Mamba-2,
Granite-4.0-H, Nemotron-H and Falcon-H1 run, each with its own MixerSpec: in_proj, the conv,
the gate, the norms and out_proj batched over the T rows; the SSM from ssmport.ops.ssd (decode:
the deferred update; prefill: the chunkwise form)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ssmport.loader.checkpoint import TensorSource
from ssmport.errors import CheckpointError
from ssmport.graph import Step
from ssmport.models.layers import CONV_STATES, RECURRENT_STATES
from ssmport.ops import ssd
from ssmport.ops.conv import causal_conv
from ssmport.ops.norms import gated_output, grouped_rms_norm
from ssmport.quant.plan import WeightBuilder


@dataclass(frozen=True)
class MixerSpec:
    """The geometry of one Mamba-2 mixer: Mamba-2's, Granite-4.0-H's and Nemotron-H's layers
    run the same mixer (Mamba2Mixer, below) with their own values (Falcon-H1 too)."""

    num_heads: int  # H
    head_dim: int  # P
    state_size: int  # N
    n_groups: int  # G: heads h use B/C group h // (H / G)
    conv_kernel: int  # K
    conv_bias: bool
    proj_bias: bool  # biases on in_proj / out_proj
    norm_eps: float  # the gated RMSNorm's
    dt_min: float = 0.0  # dt is clamped to [dt_min, dt_max] after the softplus
    dt_max: float | None = None  # None = no upper bound
    # The output norm: "gate_first" rmsnorm(y * silu(z)) (Mamba-2's), "norm_first"
    # rmsnorm(y) * silu(z), "none" y * silu(z) (Falcon-H1's mamba_rms_norm / mamba_norm_before_gate)
    gated_norm: str = "gate_first"

    @property
    def intermediate_size(self) -> int:  # I = H * P
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:  # x | B | C
        return self.intermediate_size + 2 * self.n_groups * self.state_size

    @property
    def in_proj_size(self) -> int:  # z | xBC | dt
        return self.intermediate_size + self.conv_dim + self.num_heads

    def validate(self, family: str) -> None:
        if self.num_heads % self.n_groups:
            raise CheckpointError(f"{family}: {self.num_heads} heads do not divide into {self.n_groups} groups")
        if self.conv_kernel < 2:
            raise CheckpointError(f"{family}: conv kernel {self.conv_kernel} < 2 is not supported")


class Mamba2Mixer(nn.Module):
    """z | xBC | dt = in_proj(h); xBC through the causal conv and silu; the SSM; the gated
    grouped RMSNorm (gate first); out_proj. Weights are read under `prefix` (in_proj.weight,
    conv1d.weight [C, K], dt_bias, A_log, D, norm.weight, out_proj.weight, the biases)."""

    def __init__(self, spec: MixerSpec, prefix: str, src: TensorSource, b: WeightBuilder, role: Callable[[str], str]):
        super().__init__()
        self.spec, m = spec, prefix
        vec = lambda n: b.vector(n, src[n], role(n))  # noqa: E731
        self.in_proj = b.matmul(m + "in_proj.weight", src[m + "in_proj.weight"].t(), role(m + "in_proj.weight"))
        self.in_bias = vec(m + "in_proj.bias") if spec.proj_bias else None
        self.conv_w = vec(m + "conv1d.weight")
        self.conv_b = vec(m + "conv1d.bias") if spec.conv_bias else None
        self.dt_bias = vec(m + "dt_bias")
        self.A = b.vector(m + "A_log", -torch.exp(src[m + "A_log"].float()), role(m + "A_log"))  # stored as A = -exp(A_log)
        self.D = vec(m + "D")
        self.gnorm_w = vec(m + "norm.weight") if spec.gated_norm != "none" else None
        self.out_proj = b.matmul(m + "out_proj.weight", src[m + "out_proj.weight"].t(), role(m + "out_proj.weight"))
        self.out_bias = vec(m + "out_proj.bias") if spec.proj_bias else None

    def forward(self, h: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor, step: Step):
        """h [T, D] the normed input; conv [K, conv_dim] fp32, the last K conv inputs (time-major,
        oldest first: the K-th is never read again, transformers' cache layout); ssm [H, P, N] fp32.
        Rows >= valid_len (prefill) are padding: computed, never stored. Returns (out [T, D],
        the new conv window [K, conv_dim], the new ssm: a StateUpdate (decode) or [H, P, N])."""
        c = self.spec
        I, H, P, N, G = c.intermediate_size, c.num_heads, c.head_dim, c.state_size, c.n_groups
        T = h.shape[0]
        zxbcdt = self.in_proj(h)
        if self.in_bias is not None:
            zxbcdt = zxbcdt + self.in_bias
        z, xBC, dt = zxbcdt.split([I, c.conv_dim, H], dim=-1)

        xBC, new_conv = causal_conv(conv, xBC, self.conv_w.view(c.conv_dim, c.conv_kernel).t(), step.valid_len)
        if self.conv_b is not None:
            xBC = xBC + self.conv_b
        xBC = F.silu(xBC)
        xs, BC = xBC[:, :I].reshape(T, H, P), xBC[:, I:].reshape(T, 2, G, N)  # BC: B then C, per group

        dt = F.softplus(dt + self.dt_bias)  # [T, H]
        if c.dt_min > 0 or c.dt_max is not None:
            dt = dt.clamp(c.dt_min, c.dt_max)

        # The recurrence, in fp32 whatever the state's storage dtype.
        log_decay, dtx = dt * self.A, dt.view(T, H, 1) * xs  # [T, H], [T, H, P]
        if step.decode:
            y, S = ssd.decode(ssm, torch.exp(log_decay).view(H), dtx.view(H, P), BC.view(2, G, N))
            y = y.view(1, H, P)
        else:
            S, y = ssd.chunk(ssm, log_decay, dtx, BC, step.valid_len)
        y = y + self.D.view(H, 1) * xs
        y = gated_output(y.view(T, I), F.silu(z), lambda v: grouped_rms_norm(v, self.gnorm_w, G, c.norm_eps), c.gated_norm)
        out = self.out_proj(y)
        if self.out_bias is not None:
            out = out + self.out_bias
        return out, new_conv, S


class Mamba2StateMixer(nn.Module):
    """Mamba2Mixer over the hybrids' stacked states:
    convStates [K, conv_dim] is already the time-major window it takes; recurrentStates [H, P, N]."""

    states = (CONV_STATES, RECURRENT_STATES)

    def __init__(self, spec: MixerSpec, prefix: str, src: TensorSource, b: WeightBuilder, role: Callable[[str], str]):
        super().__init__()
        self.mixer = Mamba2Mixer(spec, prefix, src, b, role)

    def forward(self, h: torch.Tensor, slices: dict, step: Step):
        out, conv, S = self.mixer(h, slices[CONV_STATES].float(), slices[RECURRENT_STATES].float(), step)
        return out, {CONV_STATES: conv, RECURRENT_STATES: S}
