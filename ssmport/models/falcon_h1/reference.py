"""The Falcon-H1 reference: plain fp32, one token at a time, written for reading.

    x = embed_tokens[id] * embedding_multiplier
    per layer:  h = rmsnorm(x; input_layernorm)
                x = x + attention_out_multiplier * attention(attention_in_multiplier * h)
                      + ssm_out_multiplier * mamba(ssm_in_multiplier * h)
                y = rmsnorm(x; pre_ff_layernorm)
                x = x + down_m * down_proj(up_proj(y) * silu(gate_m * gate_proj(y)))    (gate_m, down_m = mlp_multipliers)
    logits = lm_head(rmsnorm(x; final_layernorm)) * lm_head_multiplier

attention: GQA with RoPE over every head dim, K = k_proj(h) * key_multiplier (cached so).
mamba: Mamba-2's mixer (ssmport.models.mamba2.reference.mixer_step) with in_proj's output
z | x | B | C | dt times the µP vector (one ssm_multipliers value per segment) and the output
norm as mamba_rms_norm / mamba_norm_before_gate say (TII's Falcon-H1; transformers'
`FalconH1ForCausalLM`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ssmport.models.falcon_h1.checkpoints import EMBEDDING, FINAL_NORM, HEAD, attention, canonical_shapes, layer, mlp
from ssmport.models.falcon_h1.config import HYBRID
from ssmport.models.hybrid import reference_zero_state
from ssmport.models.layers.attention import attention_step
from ssmport.models.mamba2.reference import mixer_step
from ssmport.models.package import Reference
from ssmport.ops.norms import rms_norm_naive


class FalconH1Reference(Reference):
    """State per layer: its K and V rows of every token so far, its conv window [conv_dim, K]
    and SSM state [H, P, N]; the position."""

    shapes = staticmethod(canonical_shapes)

    def zero_state(self) -> dict:
        m = self.cfg.mixer
        return reference_zero_state(self.cfg, HYBRID, {"conv": (HYBRID, (m.conv_dim, m.conv_kernel)),
                                                       "ssm": (HYBRID, (m.num_heads, m.head_dim, m.state_size))})  # fmt: skip

    def step(self, token: int, state: dict) -> torch.Tensor:
        c, w = self.cfg, self.w
        x = w[EMBEDDING][token] * c.embedding_multiplier
        for i in range(c.num_layers):
            p = layer(i)
            h = rms_norm_naive(x, w[p + "input_layernorm.weight"], c.norm_eps)
            attn = self._attention(i, h * c.attention_in_multiplier, state)
            ssm = self._mamba(i, h * c.ssm_in_multiplier, state)
            x = x + c.attention_out_multiplier * attn + c.ssm_out_multiplier * ssm
            y = rms_norm_naive(x, w[p + "pre_ff_layernorm.weight"], c.norm_eps)
            gate, up, down = (w[n] for n in mlp(i))
            gate_m, down_m = c.mlp_multipliers
            x = x + down_m * (down @ ((up @ y) * F.silu(gate_m * (gate @ y))))
        state["position"] += 1
        return w[HEAD] @ rms_norm_naive(x, w[FINAL_NORM], c.norm_eps) * c.lm_head_multiplier

    def _mamba(self, i: int, h: torch.Tensor, state: dict) -> torch.Tensor:
        p = layer(i) + "mamba."
        w = {k.removeprefix(p): v for k, v in self.w.items() if k.startswith(p)}
        mup = torch.tensor(self.cfg.ssm_scale) / self.cfg.ssm_in_multiplier
        out, state["conv"][i] = mixer_step(self.cfg.mixer, w, h, state["conv"][i], state["ssm"][i], in_scale=mup)
        return out

    def _attention(self, i: int, h: torch.Tensor, state: dict) -> torch.Tensor:
        w = attention(self.cfg, i).read(self.w)
        w["k"] = w["k"] * self.cfg.key_multiplier  # k = k_proj(h) * key_multiplier, before RoPE and the cache
        if self.cfg.attention_bias:
            w["k_bias"] = w["k_bias"] * self.cfg.key_multiplier
        return attention_step(self.cfg.attention, w, h, state["K"][i], state["V"][i], state["position"])
