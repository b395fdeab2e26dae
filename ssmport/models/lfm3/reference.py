"""The LFM3 reference: LFM2's (ssmport.models.lfm2.reference), plain fp32, one token at a time,
with the sandwich norms and per-kind attention:

    x = x + post_operator_norm(op(operator_norm(x)));  x = x + post_ffn_norm(mlp(ffn_norm(x)))
    attention:  q, k = rmsnorm(q_proj h), rmsnorm(k_proj h) per head, proportional RoPE of the
                layer kind's theta and fraction; GQA over every cached K / V ("full_attention")
                or the last W positions ("sliding_attention"); o_h *= sigmoid(gate_proj h)_h; o_proj

(Liquid AI's LFM3; transformers' `Lfm3ForCausalLM`)."""

from __future__ import annotations

import torch

from ssmport.models.hybrid import CONV
from ssmport.models.layers.attention import attention_step
from ssmport.models.lfm2.checkpoints import layer
from ssmport.models.lfm2.reference import Lfm2Reference
from ssmport.models.lfm3.checkpoints import attention, canonical_shapes
from ssmport.ops.norms import rms_norm_naive


class Lfm3Reference(Lfm2Reference):
    """State: per conv layer the last K conv inputs [H, K] (oldest first); per attention layer
    (either kind) the K and V rows of every token so far; the position."""

    shapes = staticmethod(canonical_shapes)

    def zero_state(self) -> dict:
        c, attns = self.cfg, [i for i, kind in enumerate(self.cfg.layer_types) if kind != CONV]
        conv = {i: torch.zeros(c.hidden_size, c.conv_kernel) for i, kind in enumerate(c.layer_types) if kind == CONV}
        return {"position": 0, "conv": conv, "K": {i: [] for i in attns}, "V": {i: [] for i in attns}}

    def _post(self, i: int, what: str, y: torch.Tensor) -> torch.Tensor:
        if not self.cfg.sandwich_norm:
            return y
        return rms_norm_naive(y, self.w[layer(i) + f"post_{what}_norm.weight"], self.cfg.norm_eps)

    def _attention(self, i: int, h: torch.Tensor, state: dict) -> torch.Tensor:
        c = self.cfg
        return attention_step(c.attention_of(c.layer_types[i]), attention(c, i).read(self.w), h, state["K"][i],
                              state["V"][i], state["position"])  # fmt: skip
