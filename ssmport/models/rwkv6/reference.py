"""The RWKV-6 reference: plain fp32, one token at a time, per head, written for reading: the spec.

Per layer: a data-dependent token shift (time_maa_x, then a tanh LoRA giving the five mixes
w, k, v, r, g), the WKV-6 recurrence (ssmport.ops.wkv6) with the data-dependent decay
w = exp(-exp(time_decay + LoRA)) per key channel and the bonus time_faaaa, GroupNorm ln_x, a
silu gate, and a channel mix relu(k)^2 gated by sigmoid(r) (BlinkDL's `RWKV_x060`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ssmport.models.rwkv6.checkpoints import canonical_shapes
from ssmport.models.rwkv6.config import MIX_NAMES
from ssmport.models.rwkv7.reference import RWKV7Reference
from ssmport.ops import wkv6
from ssmport.ops.norms import group_norm_naive


class RWKV6Reference(RWKV7Reference):
    """RWKV-7's reference loop (embedding, ln0, the layer loop, head; its zero state), with
    x060's time mix and channel mix. The wkv slices are [key, value] here (the rwkv package's
    layout), the same shape as RWKV-7's [value, key] since x060 has K = V."""

    shapes = staticmethod(canonical_shapes)

    def _time_mix(self, i, x, state, v_first):
        c, w = self.cfg, self.att[i]
        H, N, D = c.num_heads, c.head_size, c.mix_lora
        delta = state["att_x"][i] - x
        state["att_x"][i] = x
        lora = torch.tanh((x + delta * w["time_maa_x"]) @ w["time_maa_w1"])  # [5 * D]
        xw, xk, xv, xr, xg = (x + delta * (w[f"time_maa_{m}"] + lora[j * D : (j + 1) * D] @ w["time_maa_w2"][j])
                              for j, m in enumerate(MIX_NAMES))  # fmt: skip
        r, k, v = w["receptance.weight"] @ xr, w["key.weight"] @ xk, w["value.weight"] @ xv
        g = F.silu(w["gate.weight"] @ xg)
        log_w = -torch.exp(w["time_decay"] + torch.tanh(xw @ w["time_decay_w1"]) @ w["time_decay_w2"])
        y = torch.empty(H, N)
        for h in range(H):
            s = slice(h * N, (h + 1) * N)
            state["wkv"][i][h], y[h] = wkv6.naive_step(state["wkv"][i][h], r[s], log_w[s], w["time_faaaa"][h], k[s], v[s])
        out = group_norm_naive(y, w["ln_x.weight"], w["ln_x.bias"], c.ln_x_eps)  # ln_x: one group per head
        return w["output.weight"] @ (out * g), v_first  # no value residual in x060

    def _channel_mix(self, i, x, state):
        p = f"blocks.{i}.ffn."
        delta = state["ffn_x"][i] - x
        state["ffn_x"][i] = x
        k = torch.relu(self.w[p + "key.weight"] @ (x + delta * self.w[p + "time_maa_k"])) ** 2
        r = torch.sigmoid(self.w[p + "receptance.weight"] @ (x + delta * self.w[p + "time_maa_r"]))
        return r * (self.w[p + "value.weight"] @ k)
