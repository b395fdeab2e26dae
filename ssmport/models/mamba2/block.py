"""The export form of a Mamba-2 layer: in_proj, the conv, the gate, the norms and out_proj
batched over the T rows; the SSM from ssmport.ops.ssd (decode: the deferred update; prefill:
the chunkwise form).

`Mamba2Mixer` is the mixer alone (everything between the pre-norm and the residual add): the
Granite-4.0-H and Nemotron-H hybrids run it in their Mamba-2 layers, on their own stacked
states."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ssmport.loader.checkpoint import TensorSource
from ssmport.graph import Embedding, Step
from ssmport.models.layers import norm_head
from ssmport.models.mamba2.config import Mamba2Config, MixerSpec
from ssmport.models.mamba2.quant import role
from ssmport.ops import ssd
from ssmport.ops.conv import causal_conv
from ssmport.ops.norms import gated_output, grouped_rms_norm, rms_norm
from ssmport.quant.plan import WeightBuilder

CONV_STATE, SSM_STATE = "convState", "ssmState"


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


class Mamba2Block(nn.Module):
    """One residual layer. States: convState [conv_dim, K] (the last K conv inputs x|B|C, oldest
    first: transformers' and mamba_ssm's conv-cache layout) and ssmState [H, P, N]."""

    states = (CONV_STATE, SSM_STATE)

    def __init__(self, cfg: Mamba2Config, i: int, src: TensorSource, b: WeightBuilder, residual_dtype: torch.dtype):
        super().__init__()
        self.cfg, self.residual_dtype = cfg, residual_dtype
        self.norm_w = b.vector(f"layers.{i}.norm.weight", src[f"layers.{i}.norm.weight"], role(f"layers.{i}.norm.weight"))
        self.mixer = Mamba2Mixer(cfg.mixer, f"layers.{i}.mixer.", src, b, role)

    def forward(self, x: torch.Tensor, slices: dict, step: Step):
        """x [T, D] fp32; rows >= valid_len (prefill) are padding: computed, never stored."""
        conv = slices[CONV_STATE].float().t()  # [K, conv_dim]: the K inputs, not K-1
        out, new_conv, S = self.mixer(rms_norm(x, self.norm_w, self.cfg.norm_eps), conv, slices[SSM_STATE].float(), step)
        x = x + out
        if self.residual_dtype != torch.float32:
            x = x.to(self.residual_dtype).float()
        return x, {CONV_STATE: new_conv.t(), SSM_STATE: S}


def build_layers(block_class: type[nn.Module]):
    """`build` of a model of Mamba-style residual blocks `block_class(cfg, i, src, b, residual_dtype)`:
    (embedding, blocks, head). residual_in_fp32=False: the checkpoint's own runtime carries the
    residual in its weight dtype, so it is rounded to the recipe's float dtype after each block."""

    def build(cfg, src: TensorSource, b: WeightBuilder):
        embed = Embedding(b.table("embeddings.weight", src["embeddings.weight"], "embedding"))
        residual = torch.float32 if cfg.residual_in_fp32 else b.recipe.float_dtype
        blocks = [block_class(cfg, i, src, b, residual) for i in range(cfg.num_layers)]
        return embed, blocks, norm_head(src, b, "lm_head.weight", "norm_f.weight", cfg.norm_eps)

    return build


build = build_layers(Mamba2Block)
