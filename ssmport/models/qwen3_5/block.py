"""The export form of Qwen3.5: one block per layer on the generic graph, its mixer the shared
delta-rule layer (linear_attention) or the shared gated attention over the KV cache
(full_attention), then the SwiGLU MLP; zero-centred RMSNorms around both.

States, in the order and with the names of Apple's Qwen3.5 export (docs/hybrids.md, section 6):
keyCache, valueCache [L_attn, 1, kv_heads, context, head_dim] (K after k-norm and RoPE),
convStates [L_linear, 1, K, conv_dim] (the last K pre-conv inputs, row 0 oldest: the taps read
rows 1..K-1 and the new input), recurrentStates [L_linear, 1, v_heads, k_dim, v_dim]."""

from __future__ import annotations

from torch import nn

from ssmport.loader.checkpoint import TensorSource
from ssmport.graph import Embedding, Step
from ssmport.models.layers import CONV_STATES, RECURRENT_STATES
from ssmport.models.layers.attention import AttentionMixer, norm_gain
from ssmport.models.layers.delta_rule import DeltaRuleMixer, DeltaRuleNames
from ssmport.models.layers.head import norm_head
from ssmport.models.layers.mlp import SwiGLU
from ssmport.models.qwen3_5.checkpoints import EMBED, HEAD, NORM, attention, layer
from ssmport.models.qwen3_5.config import FULL, ZERO_CENTRED, Qwen35Config
from ssmport.ops.norms import rms_norm
from ssmport.quant.plan import WeightBuilder
from ssmport.quant.roles import Role


def delta_rule_names(i: int) -> DeltaRuleNames:
    a = layer(i) + "linear_attn."
    return DeltaRuleNames(
        conv_input=(a + "in_proj_qkv.weight",), a=a + "in_proj_a.weight", b=a + "in_proj_b.weight",
        gate=a + "in_proj_z.weight", conv=(a + "conv1d.weight",), conv_bias=(), A_log=a + "A_log", dt_bias=a + "dt_bias",
        norm=a + "norm.weight", out=a + "out_proj.weight", fused_in=a + "{in_proj_qkv,in_proj_a,in_proj_b,in_proj_z}.weight",
        fused_conv=a + "conv1d.weight",
    )  # fmt: skip


class Qwen35Block(nn.Module):
    """x += mixer(rmsnorm1p(x)); x += mlp(rmsnorm1p(x)). Its states are its mixer's."""

    def __init__(self, cfg: Qwen35Config, i: int, src: TensorSource, b: WeightBuilder, mlp, prefix: str | None = None):
        """`prefix`: a full-attention layer stored under another prefix (the MTP layer's)."""
        super().__init__()
        p, self.eps = prefix or layer(i), cfg.rms_norm_eps
        gain = lambda n: b.vector(n, norm_gain(src[n], ZERO_CENTRED), Role.NORM)  # noqa: E731
        self.input_norm, self.post_norm = gain(p + "input_layernorm.weight"), gain(p + "post_attention_layernorm.weight")
        if prefix or cfg.layer_types[i] == FULL:
            self.mixer = AttentionMixer(cfg.attention, attention(cfg, i, prefix), src, b)
        else:
            self.mixer = DeltaRuleMixer(cfg.delta_rule, delta_rule_names(i), src, b, CONV_STATES, RECURRENT_STATES)
        self.states = self.mixer.states
        self.mlp = mlp(cfg, i, src, b) if prefix is None else swiglu(src, b, p)

    def forward(self, x, slices: dict, step: Step):
        out, states = self.mixer(rms_norm(x, self.input_norm, self.eps), slices, step)
        x = x + out
        return x + self.mlp(rms_norm(x, self.post_norm, self.eps)), states


def swiglu(src: TensorSource, b: WeightBuilder, p: str) -> nn.Module:
    """The SwiGLU MLP of the layer stored under prefix p."""
    return SwiGLU(*(f"{p}mlp.{w}_proj.weight" for w in ("gate", "up", "down")), src, b)


def dense_mlp(cfg: Qwen35Config, i: int, src: TensorSource, b: WeightBuilder) -> nn.Module:
    return swiglu(src, b, layer(i))


def build(cfg: Qwen35Config, src: TensorSource, b: WeightBuilder, mlp=dense_mlp):
    """`mlp(cfg, i, src, b)`: layer i's MLP (Qwen3.5-MoE: routed experts and a shared expert)."""
    embed = Embedding(b.table(EMBED, src[EMBED], Role.EMBEDDING))
    # A tied model's head is its embedding table (the source maps lm_head.weight to it), stored
    # a second time as [in, out]: the lookup and the matmul need different layouts. Built before
    # the layers: its fp32 read (248,320 rows: 2-2.5 GB) then comes before their weights are held.
    head = norm_head(src, b, HEAD, NORM, cfg.rms_norm_eps, gain=norm_gain(src[NORM], ZERO_CENTRED))
    return embed, [Qwen35Block(cfg, i, src, b, mlp) for i in range(cfg.num_layers)], head
