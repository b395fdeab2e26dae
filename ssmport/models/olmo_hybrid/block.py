"""The export form of OLMo-Hybrid: one block per layer on the generic graph, its mixer the
shared delta-rule layer (linear_attention) or the shared attention over the KV cache
(full_attention), then the SwiGLU MLP. The two kinds place their norms differently
(transformers' `OlmoHybridLinearAttentionDecoderLayer` / `OlmoHybridAttentionDecoderLayer`):

    linear_attention:  x += gdn(rms(x; input_layernorm));   x += mlp(rms(x; post_attention_layernorm))
    full_attention:    x += rms(attn(x); post_attention_layernorm);   x += rms(mlp(x); post_feedforward_layernorm)

States, in Apple's order and names: keyCache, valueCache [L_attn, 1, kv_heads, context,
head_dim] (K after the k-norm and RoPE), convStates [L_linear, 1, K, 2*key_dim + value_dim]
(the last K pre-conv q | k | v inputs, row 0 oldest: the three convs are depthwise, so one
window over the concatenated channels is exactly the three windows, read and written once per
call), recurrentStates [L_linear, 1, v_heads, k_dim, v_dim]."""

from __future__ import annotations

from torch import nn

from ssmport.loader.checkpoint import TensorSource
from ssmport.graph import Embedding, Step
from ssmport.models.layers import CONV_STATES, RECURRENT_STATES
from ssmport.models.layers.attention import AttentionMixer
from ssmport.models.layers.delta_rule import DeltaRuleMixer, DeltaRuleNames
from ssmport.models.layers.head import norm_head
from ssmport.models.layers.mlp import SwiGLU
from ssmport.models.olmo_hybrid.checkpoints import EMBED, HEAD, NORM, attention, layer
from ssmport.models.olmo_hybrid.config import FULL, OlmoHybridConfig
from ssmport.ops.norms import rms_norm
from ssmport.quant.plan import WeightBuilder
from ssmport.quant.roles import Role


def delta_rule_names(i: int) -> DeltaRuleNames:
    a = layer(i) + "linear_attn."
    return DeltaRuleNames(
        conv_input=(a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"), a=a + "a_proj.weight",
        b=a + "b_proj.weight", gate=a + "g_proj.weight", conv=(a + "conv1d.weight",), conv_bias=(), A_log=a + "A_log",
        dt_bias=a + "dt_bias", norm=a + "o_norm.weight", out=a + "o_proj.weight",
        fused_in=a + "{q_proj,k_proj,v_proj,a_proj,b_proj,g_proj}.weight", fused_conv=a + "conv1d.weight",
    )  # fmt: skip


class OlmoHybridBlock(nn.Module):
    """One layer: pre-norms around the Gated DeltaNet, post-norms around the attention. Its
    states are its mixer's."""

    def __init__(self, cfg: OlmoHybridConfig, i: int, src: TensorSource, b: WeightBuilder):
        super().__init__()
        p, m = layer(i), layer(i) + "mlp."
        self.eps, self.post_norms = cfg.rms_norm_eps, cfg.layer_types[i] == FULL
        first, second = ("post_attention_layernorm", "post_feedforward_layernorm") if self.post_norms else (
            "input_layernorm", "post_attention_layernorm")  # fmt: skip
        self.first_norm = b.vector(p + first + ".weight", src[p + first + ".weight"], Role.NORM)
        self.second_norm = b.vector(p + second + ".weight", src[p + second + ".weight"], Role.NORM)
        if self.post_norms:
            self.mixer = AttentionMixer(cfg.attention, attention(cfg, i), src, b)
        else:
            self.mixer = DeltaRuleMixer(cfg.delta_rule, delta_rule_names(i), src, b, CONV_STATES, RECURRENT_STATES)
        self.states = self.mixer.states
        self.mlp = SwiGLU(m + "gate_proj.weight", m + "up_proj.weight", m + "down_proj.weight", src, b)

    def forward(self, x, slices: dict, step: Step):
        if self.post_norms:
            out, states = self.mixer(x, slices, step)
            x = x + rms_norm(out, self.first_norm, self.eps)
            return x + rms_norm(self.mlp(x), self.second_norm, self.eps), states
        out, states = self.mixer(rms_norm(x, self.first_norm, self.eps), slices, step)
        x = x + out
        return x + self.mlp(rms_norm(x, self.second_norm, self.eps)), states


def build(cfg: OlmoHybridConfig, src: TensorSource, b: WeightBuilder):
    embed = Embedding(b.table(EMBED, src[EMBED], Role.EMBEDDING))
    blocks = [OlmoHybridBlock(cfg, i, src, b) for i in range(cfg.num_layers)]
    return embed, blocks, norm_head(src, b, HEAD, NORM, cfg.rms_norm_eps)
