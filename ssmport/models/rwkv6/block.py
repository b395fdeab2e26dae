"""The export form of an RWKV-6 layer: every projection batched over the T rows, the WKV
recurrence from ssmport.ops.wkv6 (decode: the deferred update; prefill: the pairwise chunk form)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ssmport.loader.checkpoint import TensorSource
from ssmport.graph import Step
from ssmport.models.blinkdl import blinkdl_model
from ssmport.models.layers.mlp import ReluSquaredMLP
from ssmport.models.rwkv6.config import MIX_NAMES, RWKV6Config
from ssmport.models.rwkv6.quant import role
from ssmport.models.rwkv7.block import REC_STATE, SHIFT_STATE
from ssmport.ops import wkv6
from ssmport.ops.norms import group_norm, layer_norm
from ssmport.ops.rows import last_valid, token_shift
from ssmport.quant.plan import WeightBuilder


class RWKV6Block(nn.Module):
    """One layer. States: recState [H, N, N] (key-major) and shiftState [2, C] (the last
    token's inputs to the time mix, after ln1, and to the channel mix, after ln2)."""

    states = (REC_STATE, SHIFT_STATE)

    def __init__(self, cfg: RWKV6Config, i: int, src: TensorSource, b: WeightBuilder):
        super().__init__()
        self.cfg = cfg
        p, a, f = f"blocks.{i}.", f"blocks.{i}.att.", f"blocks.{i}.ffn."
        vec = lambda n: b.vector(n, src[n], role(n))  # noqa: E731
        mm = lambda n: b.matmul(n, src[n].t() if n.endswith(".weight") else src[n], role(n))  # noqa: E731
        self.ln1_w, self.ln1_b, self.ln2_w, self.ln2_b = (vec(p + n) for n in ("ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias"))
        # The five mixes as one [5, 1, C] tensor, and the five LoRA up-projections as one
        # [5, D, C] batched matmul: one op each instead of five.
        mixes = torch.stack([src[f"{a}time_maa_{m}"] for m in MIX_NAMES]).unsqueeze(1)
        self.maa = b.vector(f"{a}time_maa_{{{','.join(MIX_NAMES)}}}", mixes, "mix")
        self.maa_x, self.maa_w1 = vec(a + "time_maa_x"), mm(a + "time_maa_w1")
        self.maa_w2 = vec(a + "time_maa_w2")
        self.r, self.k, self.v, self.g, self.o = (mm(a + n + ".weight") for n in ("receptance", "key", "value", "gate", "output"))
        self.decay, self.decay_w1, self.decay_w2 = vec(a + "time_decay"), mm(a + "time_decay_w1"), mm(a + "time_decay_w2")
        self.bonus = vec(a + "time_faaaa")
        self.lnx_w, self.lnx_b = vec(a + "ln_x.weight"), vec(a + "ln_x.bias")
        self.ffn_maa_k, self.ffn_maa_r = vec(f + "time_maa_k"), vec(f + "time_maa_r")
        self.ffn_r = mm(f + "receptance.weight")
        self.ffn = ReluSquaredMLP(f + "key.weight", f + "value.weight", src, b)

    def forward(self, x: torch.Tensor, slices: dict, step: Step):
        """x [T, C] fp32; rows >= valid_len (prefill) are padding: computed, never stored."""
        c, rec, shift = self.cfg, slices[REC_STATE], slices[SHIFT_STATE]
        H, N, D = c.num_heads, c.head_size, c.mix_lora
        T = x.shape[0]

        # --- time mix: the data-dependent token shift, every projection batched over the T rows ---
        xa = layer_norm(x, self.ln1_w, self.ln1_b, c.norm_eps)
        delta = (shift[0:1].float() if step.decode else token_shift(xa, shift[0:1])) - xa
        lora = torch.tanh(self.maa_w1(xa + delta * self.maa_x)).view(T, len(MIX_NAMES), D).transpose(0, 1)
        mixed = xa + delta * (self.maa + lora @ self.maa_w2)  # [5, T, C]
        xw, xk, xv, xr, xg = (m.view(T, -1) for m in mixed.split(1, dim=0))
        r, k, v, g = self.r(xr), self.k(xk), self.v(xv), F.silu(self.g(xg))
        log_w = -torch.exp(self.decay + self.decay_w2(torch.tanh(self.decay_w1(xw))))  # <= 0, unbounded below

        # The recurrence, in fp32 whatever the state's storage dtype.
        if step.decode:
            y, rec_out = wkv6.decode(rec.float(), r.view(H, N), log_w.view(H, N), self.bonus, k.view(H, N), v.view(H, N))
        else:  # the pairwise chunk form: no loop over tokens in the graph
            rec_out, y = wkv6.chunk(rec.float(), r.view(T, H, N), log_w.view(T, H, N), self.bonus, k.view(T, H, N),
                                    v.view(T, H, N), step.valid_len, max_tokens=step.max_rows)  # fmt: skip
        y = group_norm(y.view(T, H, N), self.lnx_w, self.lnx_b, c.ln_x_eps)
        x = x + self.o(y * g)

        # --- channel mix ---
        xf = layer_norm(x, self.ln2_w, self.ln2_b, c.norm_eps)
        delta_f = (shift[1:2].float() if step.decode else token_shift(xf, shift[1:2])) - xf
        x = x + torch.sigmoid(self.ffn_r(xf + delta_f * self.ffn_maa_r)) * self.ffn(xf + delta_f * self.ffn_maa_k)

        if not step.decode:  # the shift rows are the last real token's
            xa, xf = last_valid(xa, step.valid_len), last_valid(xf, step.valid_len)
        return x, {REC_STATE: rec_out, SHIFT_STATE: (xa, xf)}  # two rows, stacked without a concat


def build(cfg: RWKV6Config, src: TensorSource, b: WeightBuilder):
    return blinkdl_model(cfg, src, b, RWKV6Block)
