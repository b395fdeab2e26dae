"""The OLMo-Hybrid reference: plain fp32, one token at a time, one head at a time, written to
be read against transformers' `OlmoHybridForCausalLM` (docs/hybrids.md, section 7). Per token:

    x = embed[token]
    linear_attention layer:  x += gdn(rms(x; input_layernorm));  x += mlp(rms(x; post_attention_layernorm))
    full_attention layer:    x += rms(attn(x); post_attention_layernorm);  x += rms(mlp(x); post_feedforward_layernorm)
    logits = lm_head(rms(x; norm))

with every rms a plain RMSNorm (x / rms(x) * w), mlp(h) = down(silu(gate(h)) * up(h)) and

- gdn (Gated DeltaNet): q | k | v = q_proj(h) | k_proj(h) | v_proj(h), each through its own
  depthwise causal conv over the last K inputs (as one window of the concatenated channels),
  silu; q, k l2-normalised (q also * dk^-0.5); beta = sigmoid(b_proj(h)), times 2 with
  linear_allow_neg_eigval; g = exp(-exp(A_log) * softplus(a_proj(h) + dt_bias)); per value head
  j (q/k head j // (Hv/Hk)) the delta rule; o_j = w * rmsnorm(o_j; eps 1e-5) * silu(g_j),
  g = g_proj(h); o_proj;
- attn: q = rms(q_proj(h); q_norm) over all heads at once, k likewise, then rotate-half RoPE
  on every dim; softmax attention over every position so far (query head h reads kv head
  h // (heads/kv_heads)); o_proj.

State: per linear layer the last K pre-conv inputs (row 0 oldest) and S [Hv, dk, dv]; per
attention layer the K and V rows of every position so far (after k-norm and RoPE)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ssmport.models.hybrid import reference_zero_state
from ssmport.models.layers.attention import attention_step
from ssmport.models.layers.delta_rule import delta_rule_token
from ssmport.models.olmo_hybrid.checkpoints import EMBED, HEAD, NORM, attention, canonical_shapes, layer
from ssmport.models.olmo_hybrid.config import FULL, GATED_NORM_EPS, LINEAR
from ssmport.models.package import Reference
from ssmport.ops.norms import rms_norm_naive


class OlmoHybridReference(Reference):
    shapes = staticmethod(canonical_shapes)

    def zero_state(self) -> dict:
        c, d = self.cfg, self.cfg.delta_rule
        return reference_zero_state(c, FULL, {"conv": (LINEAR, (d.conv_kernel, d.conv_dim)),
                                              "S": (LINEAR, (d.v_heads, d.k_dim, d.v_dim))})  # fmt: skip

    def step(self, token: int, state: dict) -> torch.Tensor:
        c, w = self.cfg, self.w
        rms = lambda x, name: rms_norm_naive(x, w[name], c.rms_norm_eps)  # noqa: E731
        x = w[EMBED][token]
        for i, kind in enumerate(c.layer_types):
            p = layer(i)
            if kind == FULL:
                x = x + rms(self._attention(i, x, state), p + "post_attention_layernorm.weight")
                x = x + rms(self._mlp(i, x), p + "post_feedforward_layernorm.weight")
            else:
                x = x + self._delta_rule(i, rms(x, p + "input_layernorm.weight"), state)
                x = x + self._mlp(i, rms(x, p + "post_attention_layernorm.weight"))
        state["position"] += 1
        return w[HEAD] @ rms(x, NORM)

    def _mlp(self, i: int, h: torch.Tensor) -> torch.Tensor:
        w, m = self.w, layer(i) + "mlp."
        return w[m + "down_proj.weight"] @ (F.silu(w[m + "gate_proj.weight"] @ h) * (w[m + "up_proj.weight"] @ h))

    def _delta_rule(self, i: int, h: torch.Tensor, state: dict) -> torch.Tensor:
        w, a, d = self.w, layer(i) + "linear_attn.", self.cfg.delta_rule
        qkv = torch.cat([w[a + n + "_proj.weight"] @ h for n in "qkv"])  # the three convs' inputs, as one window
        beta = torch.sigmoid(w[a + "b_proj.weight"] @ h) * (2.0 if d.allow_neg_eigval else 1.0)
        g = torch.exp(-torch.exp(w[a + "A_log"]) * F.softplus(w[a + "a_proj.weight"] @ h + w[a + "dt_bias"]))
        state["conv"][i], out = delta_rule_token(d, state["conv"][i], state["S"][i], qkv, w[a + "conv1d.weight"], beta, g,
                                                 w[a + "g_proj.weight"] @ h, w[a + "o_norm.weight"], GATED_NORM_EPS)  # fmt: skip
        return w[a + "o_proj.weight"] @ out

    def _attention(self, i: int, x: torch.Tensor, state: dict) -> torch.Tensor:
        w = attention(self.cfg, i).read(self.w)
        return attention_step(self.cfg.attention, w, x, state["K"][i], state["V"][i], state["position"])
