"""The export form of Qwen3.5: one block per layer on the generic graph, its mixer the shared
delta-rule layer (linear_attention) or the shared gated attention over the KV cache
(full_attention), then the SwiGLU MLP; zero-centred RMSNorms around both.

States, in the order and with the names of Apple's Qwen3.5 export (docs/hybrids.md, section 6):
keyCache, valueCache [L_attn, 1, kv_heads, context, head_dim] (K after k-norm and RoPE),
convStates [L_linear, 1, K, conv_dim] (the last K pre-conv inputs, row 0 oldest: the taps read
rows 1..K-1 and the new input), recurrentStates [L_linear, 1, v_heads, k_dim, v_dim]."""

from __future__ import annotations

from torch import nn

from ssmport.checkpoint import TensorSource
from ssmport.graph import Embedding, NormHead, Step
from ssmport.models.layers import (
    CONV_STATES, RECURRENT_STATES, AttentionMixer, AttentionNames, AttentionSpec, DeltaRuleMixer, DeltaRuleNames,
    DeltaRuleSpec, SwiGLU, norm_gain,
)  # fmt: skip
from ssmport.models.qwen3_5.checkpoints import EMBED, HEAD, NORM, layer
from ssmport.models.qwen3_5.config import FULL, Qwen35Config
from ssmport.ops.norms import rms_norm
from ssmport.quant.plan import WeightBuilder
from ssmport.quant.roles import Role

ZERO_CENTRED = "rms_offset"  # x / rms(x) * (1 + w)


def attention_layer(cfg: Qwen35Config, i: int) -> tuple[AttentionSpec, AttentionNames]:
    a = layer(i) + "self_attn."
    spec = AttentionSpec(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, rotary_dim=cfg.rotary_dim,
                         rope_theta=cfg.rope_theta, qk_norm=ZERO_CENTRED, norm_eps=cfg.rms_norm_eps, output_gate=True,
                         bias=cfg.attention_bias)  # fmt: skip
    biases = {f"{n}_bias": f"{a}{n}_proj.bias" for n in "qkvo"} if cfg.attention_bias else {}
    names = AttentionNames(*(f"{a}{n}_proj.weight" for n in "qkvo"), q_norm=a + "q_norm.weight",
                           k_norm=a + "k_norm.weight", **biases)  # fmt: skip
    return spec, names


def delta_rule_layer(cfg: Qwen35Config, i: int) -> tuple[DeltaRuleSpec, DeltaRuleNames]:
    a = layer(i) + "linear_attn."
    spec = DeltaRuleSpec(cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                         cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim, norm_eps=cfg.rms_norm_eps)  # fmt: skip
    names = DeltaRuleNames(
        conv_input=(a + "in_proj_qkv.weight",), a=a + "in_proj_a.weight", b=a + "in_proj_b.weight",
        gate=a + "in_proj_z.weight", conv=(a + "conv1d.weight",), conv_bias=(), A_log=a + "A_log", dt_bias=a + "dt_bias",
        norm=a + "norm.weight", out=a + "out_proj.weight", fused_in=a + "{in_proj_qkv,in_proj_a,in_proj_b,in_proj_z}.weight",
        fused_conv=a + "conv1d.weight",
    )  # fmt: skip
    return spec, names


class Qwen35Block(nn.Module):
    """x += mixer(rmsnorm1p(x)); x += mlp(rmsnorm1p(x)). Its states are its mixer's."""

    def __init__(self, cfg: Qwen35Config, i: int, src: TensorSource, b: WeightBuilder):
        super().__init__()
        p, m = layer(i), layer(i) + "mlp."
        self.eps = cfg.rms_norm_eps
        gain = lambda n: b.vector(n, norm_gain(src[n], ZERO_CENTRED), Role.NORM)  # noqa: E731
        self.input_norm, self.post_norm = gain(p + "input_layernorm.weight"), gain(p + "post_attention_layernorm.weight")
        if cfg.layer_types[i] == FULL:
            self.mixer = AttentionMixer(*attention_layer(cfg, i), src, b)
        else:
            self.mixer = DeltaRuleMixer(*delta_rule_layer(cfg, i), src, b, CONV_STATES, RECURRENT_STATES)
        self.states = self.mixer.states
        self.mlp = SwiGLU(m + "gate_proj.weight", m + "up_proj.weight", m + "down_proj.weight", src, b)

    def forward(self, x, slices: dict, step: Step):
        out, states = self.mixer(rms_norm(x, self.input_norm, self.eps), slices, step)
        x = x + out
        return x + self.mlp(rms_norm(x, self.post_norm, self.eps)), states


def build(cfg: Qwen35Config, src: TensorSource, b: WeightBuilder):
    embed = Embedding(b.table(EMBED, src[EMBED], Role.EMBEDDING))
    blocks = [Qwen35Block(cfg, i, src, b) for i in range(cfg.num_layers)]
    norm = b.vector(NORM, norm_gain(src[NORM], ZERO_CENTRED), Role.NORM)
    # A tied model's head is its embedding table (the source maps lm_head.weight to it), stored
    # a second time as [in, out]: the lookup and the matmul need different layouts.
    head = b.matmul(HEAD, src[HEAD].t(), Role.HEAD, out_dtype=b.recipe.logits_dtype)
    return embed, blocks, NormHead(head, norm, cfg.rms_norm_eps)
