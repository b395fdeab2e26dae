"""The RecurrentGemma reference: plain fp32, one token at a time, written for reading.

x = embed[token] * bf16(sqrt(H)); each layer is x = x + temporal(norm(x)); x = x + mlp(norm(x))
with every norm an RMSNorm of gain 1 + w, where temporal is one of

    recurrent:  y = gelu_tanh(linear_y h);  c = conv1d(linear_x h) over the last K inputs
                out = linear_out(rglru(c) * y)             (ssmport.ops.rglru.naive_step)
    attention:  GQA over the last `window` tokens' K / V (itself included), RoPE on the first
                rotary_dim dims of each head; o_proj with its bias

and mlp = down(gelu_tanh(gate h) * up h), all with biases. The logits are
cap * tanh(lm_head(norm(x)) / cap) (Google's Griffin; transformers' `RecurrentGemmaForCausalLM`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ssmport.models.layers.attention import attention_step
from ssmport.models.package import Reference
from ssmport.models.recurrent_gemma.checkpoints import (EMBEDDING, FINAL_NORM, HEAD, attention, canonical_shapes,
                                                        layer)  # fmt: skip
from ssmport.models.recurrent_gemma.config import ATTENTION, RECURRENT
from ssmport.ops import rglru
from ssmport.ops.norms import rms_norm_naive


class RecurrentGemmaReference(Reference):
    """State: per recurrent layer the last K-1 conv inputs [K-1, D] (oldest first) and the
    RG-LRU state [D]; per attention layer the K and V rows of the last window-1 tokens; the position."""

    shapes = staticmethod(canonical_shapes)

    def zero_state(self) -> dict:
        c = self.cfg
        rec, attn = c.layer_indices(RECURRENT), c.layer_indices(ATTENTION)
        return {"position": 0, "conv": {i: torch.zeros(c.conv_width - 1, c.lru_width) for i in rec},
                "lru": {i: torch.zeros(c.lru_width) for i in rec}, "K": {i: [] for i in attn}, "V": {i: [] for i in attn}}  # fmt: skip

    def norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return rms_norm_naive(x, 1.0 + self.w[name], self.cfg.norm_eps)

    def step(self, token: int, state: dict) -> torch.Tensor:
        c, w = self.cfg, self.w
        x = w[EMBEDDING][token] * c.embed_scale
        for i, kind in enumerate(c.layer_types):
            h = self.norm(x, layer(i) + "temporal_pre_norm.weight")
            x = x + (self._recurrent(i, h, state) if kind == RECURRENT else self._attention(i, h, state))
            m, h = layer(i) + "mlp_block.", self.norm(x, layer(i) + "channel_pre_norm.weight")
            gate, up = (w[f"{m}{p}.weight"] @ h + w[f"{m}{p}.bias"] for p in ("gate_proj", "up_proj"))
            x = x + w[m + "down_proj.weight"] @ (F.gelu(gate, approximate="tanh") * up) + w[m + "down_proj.bias"]
        state["position"] += 1
        logits = w[HEAD] @ self.norm(x, FINAL_NORM)
        return torch.tanh(logits / c.logits_soft_cap) * c.logits_soft_cap

    def _recurrent(self, i: int, h: torch.Tensor, state: dict) -> torch.Tensor:
        t = layer(i) + "temporal_block."
        linear = lambda n, v: self.w[f"{t}{n}.weight"] @ v + self.w[f"{t}{n}.bias"]  # noqa: E731
        y = F.gelu(linear("linear_y", h), approximate="tanh")
        window = torch.cat([state["conv"][i], linear("linear_x", h)[None]])  # [K, D], the newest last
        state["conv"][i] = window[1:]
        conv = (window * self.w[t + "conv_1d.weight"].t()).sum(0) + self.w[t + "conv_1d.bias"]
        g = {n: self.w[f"{t}rg_lru.{n}"] for n in ("input_gate_weight", "input_gate_bias", "recurrent_gate_weight",
                                                   "recurrent_gate_bias", "recurrent_param")}  # fmt: skip
        state["lru"][i], out = rglru.naive_step(state["lru"][i], conv, g["input_gate_weight"], g["input_gate_bias"],
                                                g["recurrent_gate_weight"], g["recurrent_gate_bias"],
                                                g["recurrent_param"], state["position"] == 0)  # fmt: skip
        return linear("linear_out", out * y)

    def _attention(self, i: int, h: torch.Tensor, state: dict) -> torch.Tensor:
        c, keys, values = self.cfg, state["K"][i], state["V"][i]
        del keys[: max(0, len(keys) - (c.window - 1))], values[: max(0, len(values) - (c.window - 1))]
        out = attention_step(c.attention, attention(c, i).read(self.w), h, keys, values, state["position"])
        return out if c.attention_bias else out + self.w[attention(c, i).o_bias]  # o_proj's bias is always there
