"""The RWKV-7 reference: plain fp32, one token at a time, per head, in BlinkDL's state layout
S[h] [value, key] (the transpose of the export form's), written for reading: the spec.

Per layer: token shift with six learned mixes, the WKV-7 recurrence (ssmport.ops.wkv7), value
residual from layer 0, the `r_k` bonus, GroupNorm `ln_x`, the sigmoid-LoRA output gate, and a
relu^2 channel mix (BlinkDL's `RWKV_x070` and `rwkv_v7_numpy.py`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ssmport.loader.checkpoint import TensorSource
from ssmport.models.package import Reference
from ssmport.models.rwkv7.checkpoints import canonical_shapes
from ssmport.models.rwkv7.config import DECAY_SCALE, MIX_NAMES, RWKV7Config
from ssmport.ops import wkv7
from ssmport.ops.norms import group_norm_naive, unit_normalize_naive


class RWKV7Reference(Reference):
    shapes = staticmethod(canonical_shapes)

    def __init__(self, cfg: RWKV7Config, weights: TensorSource):
        super().__init__(cfg, weights)
        self.att = [{n.removeprefix(f"blocks.{i}.att."): t for n, t in self.w.items() if n.startswith(f"blocks.{i}.att.")}
                    for i in range(cfg.num_layers)]  # fmt: skip

    def zero_state(self) -> dict[str, list[torch.Tensor]]:
        c = self.cfg
        return {
            "wkv": [torch.zeros(c.num_heads, c.v_head, c.head_size) for _ in range(c.num_layers)],
            "att_x": [torch.zeros(c.hidden_size) for _ in range(c.num_layers)],
            "ffn_x": [torch.zeros(c.hidden_size) for _ in range(c.num_layers)],
        }

    def _ln(self, x, prefix):
        return F.layer_norm(x, (x.shape[0],), self.w[prefix + ".weight"], self.w[prefix + ".bias"], self.cfg.norm_eps)

    def step(self, token: int, state: dict[str, list[torch.Tensor]]) -> torch.Tensor:
        x = self.w["emb.weight"][token]
        if self.cfg.has_ln0:
            x = self._ln(x, "blocks.0.ln0")
        v_first = None
        for i in range(self.cfg.num_layers):
            out, v_first = self._time_mix(i, self._ln(x, f"blocks.{i}.ln1"), state, v_first)
            x = x + out
            x = x + self._channel_mix(i, self._ln(x, f"blocks.{i}.ln2"), state)
        return self.w["head.weight"] @ self._ln(x, "ln_out")

    def _time_mix(self, i, x, state, v_first):
        c, w = self.cfg, self.att[i]
        H, N, Nv = c.num_heads, c.head_size, c.v_head
        delta = state["att_x"][i] - x
        state["att_x"][i] = x
        xr, xw, xk, xv, xa, xg = (x + delta * w[f"x_{m}"] for m in MIX_NAMES)
        r, k, v = w["receptance.weight"] @ xr, w["key.weight"] @ xk, w["value.weight"] @ xv
        decay = torch.exp(-DECAY_SCALE * torch.sigmoid(w["w0"] + torch.tanh(xw @ w["w1"]) @ w["w2"]))
        a = torch.sigmoid(w["a0"] + (xa @ w["a1"]) @ w["a2"])
        g = torch.sigmoid(xg @ w["g1"]) @ w["g2"]
        kk = k * w["k_k"]
        k = k * (1 + (a - 1) * w["k_a"])
        if i == 0:
            v_first = v
        else:
            v = v + (v_first - v) * torch.sigmoid(w["v0"] + (xv @ w["v1"]) @ w["v2"])
        y, bonus = torch.empty(H, Nv), torch.empty(H * Nv)
        for h in range(H):
            ks, vs = slice(h * N, (h + 1) * N), slice(h * Nv, (h + 1) * Nv)
            kk_h = unit_normalize_naive(kk[ks])
            state["wkv"][i][h], y[h] = wkv7.naive_step(state["wkv"][i][h], r[ks], decay[ks], kk_h, a[ks], k[ks], v[vs])
            bonus[vs] = (r[ks] * k[ks] * w["r_k"][h]).sum() * v[vs]
        out = group_norm_naive(y, w["ln_x.weight"], w["ln_x.bias"], c.ln_x_eps) + bonus  # ln_x: one group per head
        return w["output.weight"] @ (out * g), v_first

    def _channel_mix(self, i, x, state):
        p = f"blocks.{i}.ffn."
        delta = state["ffn_x"][i] - x
        state["ffn_x"][i] = x
        k = torch.relu(self.w[p + "key.weight"] @ (x + delta * self.w[p + "x_k"])) ** 2
        return self.w[p + "value.weight"] @ k
