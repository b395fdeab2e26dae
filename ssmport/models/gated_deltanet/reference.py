"""The Gated DeltaNet reference: plain fp32, one token at a time, per value head, written for
reading. Per layer and token, with H query/key heads of size dk and HV value heads of size dv
(value head hv reads q/k head hv // (HV / H): grouped value attention when HV > H):

    q, k, v = silu(causal_conv4(x W_q)), ...          depthwise short convs, one per stream
    beta = sigmoid(x W_b)  (x2 with allow_neg_eigval)  g = -exp(A_log) * softplus(x W_a + dt_bias)
    q, k = l2norm(q), l2norm(k);  q *= dk^-0.5;   the delta rule (ssmport.ops.delta_rule)
    out = o_proj(rmsnorm(o) * w * silu(x W_g))        RMSNorm first, then the gate

around it a pre-norm residual block with a SwiGLU MLP (fla's `fla/layers/gated_deltanet.py`,
`fla/ops/gated_delta_rule/naive.py`, `fla/models/gated_deltanet/`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ssmport.models.gated_deltanet.checkpoints import canonical_shapes, layer
from ssmport.models.package import Reference
from ssmport.ops import delta_rule
from ssmport.ops.norms import l2_normalize_naive, rms_norm_naive

L2NORM_EPS = delta_rule.QK_L2NORM_EPS  # fla's in-kernel q/k normalisation: x / sqrt(sum(x^2) + 1e-6)


class GatedDeltaNetReference(Reference):
    shapes = staticmethod(canonical_shapes)

    def zero_state(self) -> dict[str, list]:
        c = self.cfg
        widths = {"q": c.key_dim, "k": c.key_dim, "v": c.value_dim}
        return {"conv": [{s: torch.zeros(c.conv_size - 1, d) for s, d in widths.items()} for _ in range(c.num_layers)],
                "S": [torch.zeros(c.num_v_heads, c.head_dim, c.head_v_dim) for _ in range(c.num_layers)]}  # fmt: skip

    def step(self, token: int, state: dict[str, list]) -> torch.Tensor:
        c, w = self.cfg, self.w
        x = w["model.embeddings.weight"][token]
        for i in range(c.num_layers):
            p, m = layer(i), layer(i) + "mlp."
            x = x + self._attention(i, rms_norm_naive(x, w[p + "attn_norm.weight"], c.norm_eps), state)
            h = rms_norm_naive(x, w[p + "mlp_norm.weight"], c.norm_eps)
            x = x + w[m + "down_proj.weight"] @ (F.silu(w[m + "gate_proj.weight"] @ h) * (w[m + "up_proj.weight"] @ h))
        return w["lm_head.weight"] @ rms_norm_naive(x, w["model.norm.weight"], c.norm_eps)

    def _short_conv(self, i: int, stream: str, x: torch.Tensor, state) -> torch.Tensor:
        """The last W inputs (oldest first) times the taps; fla's conv weight [D, 1, W]."""
        a = layer(i) + "attn."
        window = torch.cat([state["conv"][i][stream], x[None]])  # [W, D]
        state["conv"][i][stream] = window[1:]
        y = (window * self.w[f"{a}{stream}_conv1d.weight"][:, 0].t()).sum(0)
        return F.silu(y + self.w[f"{a}{stream}_conv1d.bias"] if self.cfg.conv_bias else y)

    def _attention(self, i: int, x: torch.Tensor, state) -> torch.Tensor:
        c, w, a = self.cfg, self.w, layer(i) + "attn."
        q, k, v = (self._short_conv(i, s, w[f"{a}{s}_proj.weight"] @ x, state) for s in "qkv")
        beta = torch.sigmoid(w[a + "b_proj.weight"] @ x) * (2.0 if c.allow_neg_eigval else 1.0)
        g = -torch.exp(w[a + "A_log"]) * F.softplus(w[a + "a_proj.weight"] @ x + w[a + "dt_bias"])
        out = torch.empty(c.value_dim)
        for hv in range(c.num_v_heads):
            ks, vs = slice((hv // c.group) * c.head_dim, (hv // c.group + 1) * c.head_dim), slice(hv * c.head_v_dim, (hv + 1) * c.head_v_dim)
            qh = l2_normalize_naive(q[ks], L2NORM_EPS) * c.head_dim**-0.5
            state["S"][i][hv], o = delta_rule.naive_step(state["S"][i][hv], qh, l2_normalize_naive(k[ks], L2NORM_EPS),
                                                         v[vs], beta[hv], torch.exp(g[hv]))  # fmt: skip
            o = rms_norm_naive(o, w[a + "o_norm.weight"], c.norm_eps)
            out[vs] = o * F.silu(w[a + "g_proj.weight"][vs] @ x) if c.use_gate else o
        return w[a + "o_proj.weight"] @ out
