"""The Mamba-2 reference: plain fp32, one token at a time, per head, written for reading.

One step of layer i, with H heads of P channels, N-dim state, G groups of B/C:

    z | xBC | dt = in_proj(rmsnorm(x))              xBC = x | B | C, conv_dim = H*P + 2*G*N
    xBC = silu(depthwise causal conv over the last K inputs xBC)
    dt  = softplus(dt + dt_bias)  (clamped to dt_limit)        A = -exp(A_log)   per head
    S_h = S_h * exp(dt_h * A_h) + dt_h * x_h ⊗ B_g         S_h [P, N], g = h // (H / G)
    y_h = S_h · C_g + D_h * x_h
    out = out_proj(rmsnorm_grouped(y * silu(z)))          gate first, then the norm (G groups)

(the Mamba-2 paper, state-spaces/mamba's `Mamba2.step`, transformers' `Mamba2Mixer`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ssmport.models.layers.mamba2_mixer import MixerSpec
from ssmport.models.mamba2.checkpoints import canonical_shapes
from ssmport.models.package import Reference
from ssmport.ops import ssd
from ssmport.ops.norms import rms_norm_naive


class Mamba2Reference(Reference):
    """State per layer: conv [conv_dim, K], the last K conv inputs (oldest first); ssm [H, P, N]."""

    shapes = staticmethod(canonical_shapes)

    def zero_state(self) -> dict[str, list[torch.Tensor]]:
        c = self.cfg
        return {"conv": [torch.zeros(c.conv_dim, c.conv_kernel) for _ in range(c.num_layers)],
                "ssm": [torch.zeros(c.num_heads, c.head_dim, c.state_size) for _ in range(c.num_layers)]}  # fmt: skip

    def step(self, token: int, state: dict[str, list[torch.Tensor]]) -> torch.Tensor:
        c, w = self.cfg, self.w
        x = w["embeddings.weight"][token]
        for i in range(c.num_layers):
            x = x + self._mixer(i, rms_norm_naive(x, w[f"layers.{i}.norm.weight"], c.norm_eps), state)
        return w["lm_head.weight"] @ rms_norm_naive(x, w["norm_f.weight"], c.norm_eps)

    def _mixer(self, i: int, h: torch.Tensor, state) -> torch.Tensor:
        p = f"layers.{i}.mixer."
        w = {k.removeprefix(p): v for k, v in self.w.items() if k.startswith(p)}
        out, state["conv"][i] = mixer_step(self.cfg.mixer, w, h, state["conv"][i], state["ssm"][i])
        return out


def mixer_step(c: MixerSpec, w: dict[str, torch.Tensor], h: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor,
               in_scale: torch.Tensor | None = None):  # fmt: skip
    """One token through one Mamba-2 mixer (the formulas above, from the normed input to
    out_proj). w: the mixer's fp32 weights by leaf name ("in_proj.weight", "conv1d.weight"
    [C, K], ...); h [D]; conv [conv_dim, K], the last K conv inputs, oldest first; ssm
    [H, P, N], updated in place; in_scale: a per-channel factor on in_proj's output (Falcon-H1's
    µP vector). Returns (out [D], the new conv window)."""
    I, GN, H, P, N = c.intermediate_size, c.n_groups * c.state_size, c.num_heads, c.head_dim, c.state_size
    zxbcdt = w["in_proj.weight"] @ h + (w["in_proj.bias"] if c.proj_bias else 0)
    z, xBC, dt = (zxbcdt * in_scale if in_scale is not None else zxbcdt).split([I, c.conv_dim, H])
    window = torch.cat([conv[:, 1:], xBC[:, None]], dim=1)  # [conv_dim, K]
    xBC = (window * w["conv1d.weight"]).sum(-1) + (w["conv1d.bias"] if c.conv_bias else 0)
    xs, B, C = F.silu(xBC).split([I, GN, GN])
    y = torch.empty(I)
    for head in range(H):
        g, hs = head // (H // c.n_groups), slice(head * P, (head + 1) * P)
        dt_h = F.softplus(dt[head] + w["dt_bias"][head]).clamp(c.dt_min, c.dt_max)
        gs = slice(g * N, (g + 1) * N)
        ssm[head], y[hs] = ssd.naive_step(ssm[head], xs[hs], dt_h, -torch.exp(w["A_log"][head]), B[gs], C[gs])
        y[hs] += w["D"][head] * xs[hs]
    gate = F.silu(z)
    if c.gated_norm == "gate_first":  # Mamba-2: gate first, then the grouped norm
        y = y * gate
    if c.gated_norm != "none":
        y = torch.cat([rms_norm_naive(part, None, c.norm_eps) for part in y.view(c.n_groups, -1)]) * w["norm.weight"]
    if c.gated_norm != "gate_first":  # Falcon-H1's orders: the norm (if any) before the gate
        y = y * gate
    return w["out_proj.weight"] @ y + (w["out_proj.bias"] if c.proj_bias else 0), window
