"""The export form of an RWKV-7 layer: every projection batched over the T rows, the WKV
recurrence from ssmport.ops.wkv7 (decode: the deferred update; prefill: the chunkwise form)."""

from __future__ import annotations

import torch
from torch import nn

from ssmport.loader.checkpoint import TensorSource
from ssmport.graph import Step
from ssmport.models.blinkdl import blinkdl_model
from ssmport.models.layers.mlp import ReluSquaredMLP
from ssmport.models.rwkv7.config import DECAY_SCALE, MIX_NAMES, RWKV7Config
from ssmport.models.rwkv7.quant import role
from ssmport.ops import wkv7
from ssmport.ops.norms import group_norm, layer_norm, normalize_last, unit_normalize
from ssmport.ops.rows import last_valid, token_shift
from ssmport.quant.plan import WeightBuilder

REC_STATE, SHIFT_STATE = "recState", "shiftState"


class RWKV7Block(nn.Module):
    """One layer. States: recState [H, N, Nv] (key-major) and shiftState [2, C] (the last
    token's inputs to the time mix, after ln1, and to the channel mix, after ln2)."""

    states = (REC_STATE, SHIFT_STATE)
    flat_reads = (REC_STATE,)  # read as a row: the converter would widen its readers (ssmport.ops.rows.read_layer)

    def __init__(self, cfg: RWKV7Config, i: int, src: TensorSource, b: WeightBuilder):
        super().__init__()
        self.cfg, self.index = cfg, i
        p, a, f = f"blocks.{i}.", f"blocks.{i}.att.", f"blocks.{i}.ffn."
        vec = lambda n: b.vector(n, src[n], role(n))  # noqa: E731
        mm = lambda n: b.matmul(n, src[n].t() if n.endswith(".weight") else src[n], role(n))  # noqa: E731
        self.ln1_w, self.ln1_b, self.ln2_w, self.ln2_b = (vec(p + n) for n in ("ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias"))
        # The six mixes as one [6, C] tensor: one broadcast multiply instead of six.
        self.mix = b.vector(f"{a}x_{{{','.join(MIX_NAMES)}}}", torch.stack([src[f"{a}x_{m}"] for m in MIX_NAMES]), "mix")
        self.r, self.k, self.v, self.o = (mm(a + n + ".weight") for n in ("receptance", "key", "value", "output"))
        self.w0, self.w1, self.w2 = vec(a + "w0"), mm(a + "w1"), mm(a + "w2")
        self.a0, self.a1, self.a2 = vec(a + "a0"), mm(a + "a1"), mm(a + "a2")
        if i > 0:
            self.v0, self.v1, self.v2 = vec(a + "v0"), mm(a + "v1"), mm(a + "v2")
        self.g1, self.g2 = mm(a + "g1"), mm(a + "g2")
        self.k_k, self.k_a, self.r_k = vec(a + "k_k"), vec(a + "k_a"), vec(a + "r_k")
        self.lnx_w, self.lnx_b = vec(a + "ln_x.weight"), vec(a + "ln_x.bias")
        self.ffn_mix, self.ffn = vec(f + "x_k"), ReluSquaredMLP(f + "key.weight", f + "value.weight", src, b)

    def forward(self, x: torch.Tensor, slices: dict, step: Step):
        """x [T, C] fp32; rows >= valid_len (prefill) are padding: computed, never stored."""
        c, rec, shift = self.cfg, slices[REC_STATE], slices[SHIFT_STATE]
        H, N, Nv = c.num_heads, c.head_size, c.v_head
        T = x.shape[0]

        # --- time mix: every projection batched over the T rows ---
        xa = layer_norm(x, self.ln1_w, self.ln1_b, c.norm_eps)
        previous, previous_f = shift.float().split(1)  # the two shift rows in one op
        if step.decode:
            mixed = xa + (previous - xa) * self.mix  # [6, C]
        else:
            mixed = xa + (token_shift(xa, previous) - xa) * self.mix.view(len(MIX_NAMES), 1, -1)  # [6, T, C]
        xr, xw, xk, xv, xa_, xg = (m.view(T, -1) for m in mixed.split(1, dim=0))
        r, k, v = self.r(xr), self.k(xk), self.v(xv)
        decay = torch.exp(-DECAY_SCALE * torch.sigmoid(self.w0 + self.w2(torch.tanh(self.w1(xw)))))
        a = torch.sigmoid(self.a0 + self.a2(self.a1(xa_)))
        g = self.g2(torch.sigmoid(self.g1(xg)))
        # decode: every per-head operand as head rows [H, 1, d], one reshape each
        heads = (lambda t: t.view(H, 1, -1)) if step.decode else (lambda t: t.view(T, H, -1))  # noqa: E731
        kk = unit_normalize(heads(k * self.k_k))
        k = k * ((1 - self.k_a) + a * self.k_a)
        if self.index == 0:
            step.carry["v_first"] = v
        else:
            v = v + (step.carry["v_first"] - v) * torch.sigmoid(self.v0 + self.v2(self.v1(xv)))
        kka, r, k, v = kk * heads(a), heads(r), heads(k), heads(v)
        rk = r * k

        # The recurrence, in fp32 whatever the state's storage dtype; then ln_x and the bonus
        # term, per head (r.(k*r_k)) v.
        if step.decode:
            y, rec_out = wkv7.decode(rec.float(), r, heads(decay), kk, kka, k, v, rk)  # [H, 1, Nv]
            y = normalize_last(y, c.ln_x_eps) * self.lnx_w.view(H, 1, Nv) + self.lnx_b.view(H, 1, Nv)
            y = (y + (rk * self.r_k.view(H, 1, N)).sum(dim=-1, keepdim=True) * v).view(T, H * Nv)
        else:  # the chunkwise form: no loop in the graph
            rec_out, y = wkv7.chunk(rec.float(), r, heads(decay), kk, kka, k, v, step.valid_len, step.max_rows)
            y = group_norm(y, self.lnx_w, self.lnx_b, c.ln_x_eps)
            y = y + ((rk * self.r_k.view(H, N)).sum(dim=-1, keepdim=True) * v).view(T, H * Nv)
        x = x + self.o(y * g)

        # --- channel mix ---
        xf = layer_norm(x, self.ln2_w, self.ln2_b, c.norm_eps)
        kf = xf + ((previous_f if step.decode else token_shift(xf, previous_f)) - xf) * self.ffn_mix
        x = x + self.ffn(kf)

        if not step.decode:  # the shift rows are the last real token's
            xa, xf = last_valid(xa, step.valid_len), last_valid(xf, step.valid_len)
        return x, {REC_STATE: rec_out, SHIFT_STATE: (xa, xf)}  # two rows, stacked without a concat


def build(cfg: RWKV7Config, src: TensorSource, b: WeightBuilder):
    return blinkdl_model(cfg, src, b, RWKV7Block)
