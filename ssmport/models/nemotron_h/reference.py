"""The Nemotron-H reference: plain fp32, one token at a time, written for reading.

    x = embeddings[id]
    per layer:  x = x + mixer(rmsnorm(x; norm))     the layer's kind from the pattern:
                M  Mamba-2 (ssmport.models.mamba2.reference.mixer_step; dt not clamped, see config.py)
                *  GQA attention, no positional encoding, scale head_dim^-0.5
                -  down_proj(relu(up_proj(h))^2)
                E  routed relu^2 experts + the shared one (ssmport.models.moe.moe_naive)
    logits = lm_head(rmsnorm(x; norm_f))

(NVIDIA's Nemotron-H; transformers' `NemotronHForCausalLM`)."""

from __future__ import annotations

import torch

from ssmport.models.hybrid import mamba_attention_zero_state
from ssmport.models.layers.attention import attention_step
from ssmport.models.mamba2.reference import mixer_step
from ssmport.models.moe import RoutedReference
from ssmport.models.nemotron_h.checkpoints import EMBEDDING, FINAL_NORM, HEAD, attention, canonical_shapes, layer, moe_names
from ssmport.models.nemotron_h.config import ATTENTION, MAMBA, MOE
from ssmport.models.package import Reference
from ssmport.ops.norms import rms_norm_naive


class NemotronHReference(RoutedReference, Reference):
    """State: per Mamba-2 layer its conv window [conv_dim, K] and SSM state [H, P, N]; per
    attention layer the K and V rows of every token so far; the position. MLP and MoE layers
    hold none (the experts each MoE layer chose are kept in `chosen`)."""

    shapes = staticmethod(canonical_shapes)

    def zero_state(self) -> dict:
        return mamba_attention_zero_state(self.cfg)

    def step(self, token: int, state: dict) -> torch.Tensor:
        c, w = self.cfg, self.w
        x = w[EMBEDDING][token]
        for i, kind in enumerate(c.layer_types):
            m = layer(i) + "mixer."
            h = rms_norm_naive(x, w[layer(i) + "norm.weight"], c.norm_eps)
            mixer = {k.removeprefix(m): v for k, v in w.items() if k.startswith(m)}
            if kind == MAMBA:
                out, state["conv"][i] = mixer_step(c.mixer, mixer, h, state["conv"][i], state["ssm"][i])
            elif kind == ATTENTION:
                out = attention_step(c.attention, attention(i).read(w), h, state["K"][i], state["V"][i], state["position"])
            elif kind == MOE:
                out = self.routed(i, c.moe, moe_names(i), h)
            else:
                out = mixer["down_proj.weight"] @ torch.relu(mixer["up_proj.weight"] @ h) ** 2
            x = x + out
        state["position"] += 1
        return w[HEAD] @ rms_norm_naive(x, w[FINAL_NORM], c.norm_eps)
