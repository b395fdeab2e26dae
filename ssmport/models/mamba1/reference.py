"""The Mamba-1 / Falcon-Mamba reference: plain fp32, one token at a time, written for reading.

One step of layer i, with I channels, an N-dim state per channel and a rank-R dt:

    x | z = in_proj(rmsnorm(h))                                  x, z [I]
    x = silu(depthwise causal conv over the last K inputs x)
    dt_r | B | C = x_proj(x)                                     [R], [N], [N]
    (Falcon-Mamba: dt_r, B, C each through a weightless RMSNorm, eps mixer_rms_eps)
    dt = softplus(dt_proj(dt_r))                 [I]             A = -exp(A_log)   [I, N]
    S = S * exp(dt A) + (dt x) B^T               S [I, N]
    y = S C + D x
    out = out_proj(y * silu(z))

(Gu & Dao 2023, state-spaces/mamba's `Mamba.step`, transformers' `MambaMixer` / `FalconMambaMixer`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ssmport.models.mamba1.checkpoints import canonical_shapes
from ssmport.models.mamba2.reference import Mamba2Reference
from ssmport.ops import selective_scan
from ssmport.ops.norms import rms_norm_naive


class Mamba1Reference(Mamba2Reference):
    """State per layer: conv [I, K], the last K conv inputs (oldest first); ssm [I, N]. The
    residual loop (`step`) is Mamba-2's; the mixer is this one."""

    shapes = staticmethod(canonical_shapes)

    def zero_state(self) -> dict[str, list[torch.Tensor]]:
        c = self.cfg
        return {"conv": [torch.zeros(c.intermediate_size, c.conv_kernel) for _ in range(c.num_layers)],
                "ssm": [torch.zeros(c.intermediate_size, c.state_size) for _ in range(c.num_layers)]}  # fmt: skip

    def _mixer(self, i: int, h: torch.Tensor, state) -> torch.Tensor:
        c, p = self.cfg, f"layers.{i}.mixer."
        w = {k.removeprefix(p): v for k, v in self.w.items() if k.startswith(p)}
        bias = lambda name: w[name] if name in w else 0  # noqa: E731
        x, z = (w["in_proj.weight"] @ h + bias("in_proj.bias")).chunk(2)
        state["conv"][i] = window = torch.cat([state["conv"][i][:, 1:], x[:, None]], dim=1)  # [I, K]
        x = F.silu((window * w["conv1d.weight"]).sum(-1) + bias("conv1d.bias"))
        dt, B, C = (w["x_proj.weight"] @ x).split([c.dt_rank, c.state_size, c.state_size])
        if c.bcdt_norm_eps is not None:
            dt, B, C = (rms_norm_naive(v, None, c.bcdt_norm_eps) for v in (dt, B, C))
        dt = F.softplus(w["dt_proj.weight"] @ dt + w["dt_proj.bias"])
        state["ssm"][i], y = selective_scan.naive_step(state["ssm"][i], x, dt, -torch.exp(w["A_log"]), B, C)
        return w["out_proj.weight"] @ ((y + w["D"] * x) * F.silu(z)) + bias("out_proj.bias")
