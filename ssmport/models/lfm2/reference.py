"""The LFM2 reference: plain fp32, one token at a time, written for reading.

Each layer is x = x + op(rmsnorm(x)); x = x + w2(silu(w1 y) * w3 y) with y = rmsnorm(x), where
op is one of

    conv:       B | C | x = in_proj(h)          u = B * x   (the conv state keeps the last K u's)
                y = sum_j conv[:, j] * u_(t-K+1+j)           out = out_proj(C * y)
    attention:  q, k = rmsnorm(q_proj h), rmsnorm(k_proj h) per head, RoPE on both; GQA over
                the cached K / V; out_proj

and the logits are lm_head(rmsnorm(x; embedding_norm)) (Liquid AI's LFM2; transformers'
`Lfm2ForCausalLM`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ssmport.models.hybrid import reference_zero_state
from ssmport.models.layers.attention import attention_step
from ssmport.models.lfm2.checkpoints import EMBEDDING, HEAD, attention, canonical_shapes, layer
from ssmport.models.lfm2.config import ATTENTION, CONV
from ssmport.models.package import Reference
from ssmport.ops.norms import rms_norm_naive


class Lfm2Reference(Reference):
    """State: per conv layer the last K conv inputs [H, K] (oldest first); per attention layer
    the K and V rows of every token so far; the position."""

    shapes = staticmethod(canonical_shapes)

    def zero_state(self) -> dict:
        return reference_zero_state(self.cfg, ATTENTION, {"conv": (CONV, (self.cfg.hidden_size, self.cfg.conv_kernel))})

    def step(self, token: int, state: dict) -> torch.Tensor:
        c, w = self.cfg, self.w
        x = w[EMBEDDING][token]
        for i, kind in enumerate(c.layer_types):
            p = layer(i)
            h = rms_norm_naive(x, w[p + "operator_norm.weight"], c.norm_eps)
            x = x + self._post(i, "operator", self._conv(i, h, state) if kind == CONV else self._attention(i, h, state))
            x = x + self._post(i, "ffn", self._mlp(i, rms_norm_naive(x, w[p + "ffn_norm.weight"], c.norm_eps)))
        state["position"] += 1
        return w[HEAD] @ rms_norm_naive(x, w["model.embedding_norm.weight"], c.norm_eps)

    def _post(self, i: int, what: str, y: torch.Tensor) -> torch.Tensor:
        """What enters the residual of layer i's "operator" or "ffn" output (LFM3: a norm)."""
        return y

    def _mlp(self, i: int, y: torch.Tensor) -> torch.Tensor:
        f = layer(i) + "feed_forward."
        return self.w[f + "w2.weight"] @ (F.silu(self.w[f + "w1.weight"] @ y) * (self.w[f + "w3.weight"] @ y))

    def _conv(self, i: int, h: torch.Tensor, state: dict) -> torch.Tensor:
        c, p = self.cfg, layer(i) + "conv."
        bias = (lambda n: self.w[p + n]) if c.conv_bias else (lambda n: 0)  # noqa: E731
        B, C, xc = (self.w[p + "in_proj.weight"] @ h + bias("in_proj.bias")).chunk(3)
        state["conv"][i] = window = torch.cat([state["conv"][i][:, 1:], (B * xc)[:, None]], dim=1)  # [H, K]
        y = (window * self.w[p + "conv.weight"]).sum(-1) + bias("conv.bias")
        return self.w[p + "out_proj.weight"] @ (C * y) + bias("out_proj.bias")

    def _attention(self, i: int, h: torch.Tensor, state: dict) -> torch.Tensor:
        return attention_step(self.cfg.attention, attention(i).read(self.w), h, state["K"][i], state["V"][i], state["position"])
