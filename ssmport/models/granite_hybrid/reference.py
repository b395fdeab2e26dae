"""The Granite-4.0-H reference: plain fp32, one token at a time, written for reading.

    x = embed_tokens[id] * embedding_multiplier
    per layer:  x = x + residual_multiplier * mixer(rmsnorm(x; input_layernorm))
                x = x + residual_multiplier * output_linear(silu(a) * b),  a | b = input_linear(rmsnorm(x; post_attention_layernorm))
    logits = lm_head(rmsnorm(x; norm)) / logits_scaling

The mixer is Mamba-2's (ssmport.models.mamba2.reference.mixer_step) or GQA attention scaled by
attention_multiplier, with no positional encoding under "nope" (IBM's Granite 4.0;
transformers' `GraniteMoeHybridForCausalLM`, dense: the shared MLP only)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ssmport.models.granite_hybrid.checkpoints import EMBEDDING, FINAL_NORM, HEAD, attention, canonical_shapes, layer, moe_names
from ssmport.models.granite_hybrid.config import MAMBA
from ssmport.models.hybrid import mamba_attention_zero_state
from ssmport.models.layers.attention import attention_step
from ssmport.models.mamba2.reference import mixer_step
from ssmport.models.moe import RoutedReference
from ssmport.models.package import Reference
from ssmport.ops.norms import rms_norm_naive


class GraniteHybridReference(RoutedReference, Reference):
    """State: per Mamba-2 layer its conv window [conv_dim, K] and SSM state [H, P, N]; per
    attention layer the K and V rows of every token so far; the position."""

    shapes = staticmethod(canonical_shapes)

    def zero_state(self) -> dict:
        return mamba_attention_zero_state(self.cfg)

    def step(self, token: int, state: dict) -> torch.Tensor:
        c, w = self.cfg, self.w
        x = w[EMBEDDING][token] * c.embedding_multiplier
        for i, kind in enumerate(c.layer_types):
            p = layer(i)
            h = rms_norm_naive(x, w[p + "input_layernorm.weight"], c.norm_eps)
            x = x + c.residual_multiplier * (self._mamba(i, h, state) if kind == MAMBA else self._attention(i, h, state))
            y = rms_norm_naive(x, w[p + "post_attention_layernorm.weight"], c.norm_eps)
            a, b = (w[p + "shared_mlp.input_linear.weight"] @ y).chunk(2)
            mlp = w[p + "shared_mlp.output_linear.weight"] @ (F.silu(a) * b)
            if c.num_local_experts:  # the routed experts, beside the shared MLP (ssmport.models.moe.moe_naive)
                mlp = mlp + self.routed(i, c.moe, moe_names(i), y)
            x = x + c.residual_multiplier * mlp
        state["position"] += 1
        return w[HEAD] @ rms_norm_naive(x, w[FINAL_NORM], c.norm_eps) / c.logits_scaling

    def _mamba(self, i: int, h: torch.Tensor, state: dict) -> torch.Tensor:
        p = layer(i) + "mamba."
        w = {k.removeprefix(p): v for k, v in self.w.items() if k.startswith(p)}
        out, state["conv"][i] = mixer_step(self.cfg.mixer, w, h, state["conv"][i], state["ssm"][i])
        return out

    def _attention(self, i: int, h: torch.Tensor, state: dict) -> torch.Tensor:
        w = attention(self.cfg, i).read(self.w)
        return attention_step(self.cfg.attention, w, h, state["K"][i], state["V"][i], state["position"])
