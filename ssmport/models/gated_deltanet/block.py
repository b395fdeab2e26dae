"""The export form of a Gated DeltaNet layer: the shared delta-rule layer (ssmport.models.layers:
the six input projections fused in one matmul, the three short convs as one, the delta rule from
ssmport.ops.delta_rule, the gated norm) and the SwiGLU MLP."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ssmport.loader.checkpoint import TensorSource
from ssmport.graph import Embedding, Step
from ssmport.models.gated_deltanet.checkpoints import layer
from ssmport.models.gated_deltanet.config import GatedDeltaNetConfig
from ssmport.models.gated_deltanet.quant import role
from ssmport.models.layers.delta_rule import DeltaRuleMixer, DeltaRuleNames, DeltaRuleSpec
from ssmport.models.layers.head import norm_head
from ssmport.ops.norms import rms_norm
from ssmport.quant.plan import WeightBuilder

CONV_STATE, REC_STATE = "convState", "recState"


def delta_rule_layer(cfg: GatedDeltaNetConfig, i: int) -> tuple[DeltaRuleSpec, DeltaRuleNames]:
    """Layer i's delta-rule spec and fla's weight names (q, k, v, a, b and g fused in one matmul)."""
    a = layer(i) + "attn."
    spec = DeltaRuleSpec(cfg.num_heads, cfg.num_v_heads, cfg.head_dim, cfg.head_v_dim, cfg.conv_size,
                         conv_bias=cfg.conv_bias, output_gate=cfg.use_gate, allow_neg_eigval=cfg.allow_neg_eigval,
                         norm_eps=cfg.norm_eps)  # fmt: skip
    streams = "q,k,v,a,b,g" if cfg.use_gate else "q,k,v,a,b"
    names = DeltaRuleNames(
        conv_input=tuple(f"{a}{s}_proj.weight" for s in "qkv"), a=a + "a_proj.weight", b=a + "b_proj.weight",
        gate=a + "g_proj.weight" if cfg.use_gate else None, conv=tuple(f"{a}{s}_conv1d.weight" for s in "qkv"),
        conv_bias=tuple(f"{a}{s}_conv1d.bias" for s in "qkv") if cfg.conv_bias else (), A_log=a + "A_log",
        dt_bias=a + "dt_bias", norm=a + "o_norm.weight", out=a + "o_proj.weight", fused_in=f"{a}{{{streams}}}_proj.weight",
        fused_conv=f"{a}{{q,k,v}}_conv1d.weight", fused_conv_bias=f"{a}{{q,k,v}}_conv1d.bias" if cfg.conv_bias else None,
    )  # fmt: skip
    return spec, names


class GatedDeltaNetBlock(nn.Module):
    """One layer. States: convState [W-1, 2*H*dk + HV*dv] (the last W-1 pre-conv q | k | v
    inputs, oldest first) and recState [HV, dk, dv] (key-major)."""

    states = (CONV_STATE, REC_STATE)

    def __init__(self, cfg: GatedDeltaNetConfig, i: int, src: TensorSource, b: WeightBuilder):
        super().__init__()
        self.cfg = cfg
        p, m = layer(i), layer(i) + "mlp."
        vec = lambda n: b.vector(n, src[n], role(n))  # noqa: E731
        self.attn_norm, self.mlp_norm = vec(p + "attn_norm.weight"), vec(p + "mlp_norm.weight")
        self.mixer = DeltaRuleMixer(*delta_rule_layer(cfg, i), src, b, CONV_STATE, REC_STATE)
        gate_up = torch.cat([src[m + "gate_proj.weight"], src[m + "up_proj.weight"]]).t()
        self.gate_up = b.matmul(m + "{gate,up}_proj.weight", gate_up, "ffn")
        del gate_up
        self.down = b.matmul(m + "down_proj.weight", src[m + "down_proj.weight"].t(), "ffn")

    def forward(self, x, slices: dict, step: Step):
        """x [T, C] fp32; rows >= valid_len (prefill) are padding: computed, never stored."""
        c = self.cfg
        out, states = self.mixer(rms_norm(x, self.attn_norm, c.norm_eps), slices, step)
        x = x + out
        gate, up = self.gate_up(rms_norm(x, self.mlp_norm, c.norm_eps)).split([c.intermediate_size] * 2, dim=-1)
        return x + self.down(F.silu(gate) * up), states


def build(cfg: GatedDeltaNetConfig, src: TensorSource, b: WeightBuilder):
    embed = Embedding(b.table("model.embeddings.weight", src["model.embeddings.weight"], "embedding"))
    blocks = [GatedDeltaNetBlock(cfg, i, src, b) for i in range(cfg.num_layers)]
    return embed, blocks, norm_head(src, b, "lm_head.weight", "model.norm.weight", cfg.norm_eps)
