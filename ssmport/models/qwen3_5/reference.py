"""The Qwen3.5 reference: plain fp32, one token at a time, one head at a time, written to be
read against transformers' `Qwen3_5ForCausalLM` (docs/hybrids.md, section 1). Per token:

    x = embed[token]
    each layer:  x += mixer(rmsnorm1p(x));  x += down(silu(gate(h)) * up(h)),  h = rmsnorm1p(x)
    logits = lm_head(rmsnorm1p(x))

with rmsnorm1p(x) = x / rms(x) * (1 + w) (Qwen3.5's zero-centred norm) and the mixer either

- linear_attention (Gated DeltaNet): u = in_proj_qkv(h) into a depthwise causal conv over the
  last K inputs, silu; q, k l2-normalised (q also * dk^-0.5); beta = sigmoid(in_proj_b(h)),
  g = exp(-exp(A_log) * softplus(in_proj_a(h) + dt_bias)); per value head j (q/k head
  j // (Hv/Hk)) the delta rule; o_j = w * rmsnorm(o_j) * silu(z_j), z = in_proj_z(h); out_proj;
- full_attention: q_proj gives [query | gate] per head; q and k rmsnorm1p per head, partial
  rotate-half RoPE on the first rotary_dim dims; softmax attention over every position so far
  (query head h reads kv head h // (heads/kv_heads)); o * sigmoid(gate); o_proj.

State: per linear layer the last K pre-conv inputs (row 0 oldest) and S [Hv, dk, dv]; per
attention layer the K and V rows of every position so far (after k-norm and RoPE)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ssmport.models.hybrid import reference_zero_state
from ssmport.models.layers.attention import attention_step
from ssmport.models.layers.delta_rule import delta_rule_token
from ssmport.models.package import Reference
from ssmport.models.qwen3_5.checkpoints import EMBED, HEAD, NORM, attention, canonical_shapes, layer
from ssmport.models.qwen3_5.config import FULL, LINEAR
from ssmport.ops.norms import rms_norm_naive


def rms_norm_1p(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3.5's zero-centred RMSNorm: x / rms(x) * (1 + w)."""
    return rms_norm_naive(x, 1.0 + w, eps)


class Qwen35Reference(Reference):
    shapes = staticmethod(canonical_shapes)

    def zero_state(self) -> dict:
        c = self.cfg
        return reference_zero_state(c, FULL, {
            "conv": (LINEAR, (c.linear_conv_kernel_dim, c.delta_rule.conv_dim)),
            "S": (LINEAR, (c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim))})

    def step(self, token: int, state: dict) -> torch.Tensor:
        c, w = self.cfg, self.w
        x = w[EMBED][token]
        for i, kind in enumerate(c.layer_types):
            p = layer(i)
            h = rms_norm_1p(x, w[p + "input_layernorm.weight"], c.rms_norm_eps)
            x = x + (self._attention(i, h, state) if kind == FULL else self._delta_rule(i, h, state))
            x = x + self._mlp(i, rms_norm_1p(x, w[p + "post_attention_layernorm.weight"], c.rms_norm_eps))
        state["position"] += 1
        return w[HEAD] @ rms_norm_1p(x, w[NORM], c.rms_norm_eps)

    def _mlp(self, i: int, h: torch.Tensor) -> torch.Tensor:
        w, m = self.w, layer(i) + "mlp."
        return w[m + "down_proj.weight"] @ (F.silu(w[m + "gate_proj.weight"] @ h) * (w[m + "up_proj.weight"] @ h))

    def _delta_rule(self, i: int, h: torch.Tensor, state: dict) -> torch.Tensor:
        c, w, a = self.cfg, self.w, layer(i) + "linear_attn."
        beta = torch.sigmoid(w[a + "in_proj_b.weight"] @ h)
        g = torch.exp(-torch.exp(w[a + "A_log"]) * F.softplus(w[a + "in_proj_a.weight"] @ h + w[a + "dt_bias"]))
        state["conv"][i], out = delta_rule_token(c.delta_rule, state["conv"][i], state["S"][i], w[a + "in_proj_qkv.weight"] @ h,
                                                 w[a + "conv1d.weight"], beta, g, w[a + "in_proj_z.weight"] @ h,
                                                 w[a + "norm.weight"], c.rms_norm_eps)  # fmt: skip
        return w[a + "out_proj.weight"] @ out

    def _attention(self, i: int, h: torch.Tensor, state: dict) -> torch.Tensor:
        w = attention(self.cfg, i).read(self.w)
        return attention_step(self.cfg.attention, w, h, state["K"][i], state["V"][i], state["position"])
