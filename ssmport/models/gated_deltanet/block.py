"""The export form of a Gated DeltaNet layer: the six input projections fused in one matmul,
the three short convs as one, the delta rule from ssmport.ops.delta_rule (decode: the deferred
update; prefill: the chunkwise WY form), the gated norm and the SwiGLU MLP."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ssmport.checkpoint import TensorSource
from ssmport.graph import Embedding, NormHead, Step
from ssmport.models.gated_deltanet.checkpoints import layer
from ssmport.models.gated_deltanet.config import GatedDeltaNetConfig
from ssmport.models.gated_deltanet.quant import role
from ssmport.models.gated_deltanet.reference import L2NORM_EPS
from ssmport.ops import delta_rule
from ssmport.ops.conv import causal_conv
from ssmport.ops.norms import l2_normalize, rms_norm
from ssmport.quant.plan import WeightBuilder

CONV_STATE, REC_STATE = "convState", "recState"
IN_PROJ = ("q", "k", "v", "a", "b", "g")  # the six projections of the normed input, fused in one matmul


class GatedDeltaNetBlock(nn.Module):
    """One layer. States: convState [W-1, 2*H*dk + HV*dv] (the last W-1 pre-conv q | k | v
    inputs, oldest first) and recState [HV, dk, dv] (key-major)."""

    states = (CONV_STATE, REC_STATE)

    def __init__(self, cfg: GatedDeltaNetConfig, i: int, src: TensorSource, b: WeightBuilder):
        super().__init__()
        self.cfg = cfg
        p, a, m = layer(i), layer(i) + "attn.", layer(i) + "mlp."
        vec = lambda n: b.vector(n, src[n], role(n))  # noqa: E731
        self.attn_norm, self.mlp_norm = vec(p + "attn_norm.weight"), vec(p + "mlp_norm.weight")
        # q, k, v, a, b (and g) all read the normed input: one [C, sum(out)] matmul, split after.
        streams = [s for s in IN_PROJ if s != "g" or cfg.use_gate]
        sizes = [src.shape(f"{a}{s}_proj.weight")[0] for s in streams]
        self.in_split = [sum(sizes[:3]), *sizes[3:]]  # q|k|v (conv input), a, b, (g)
        fused = torch.cat([src[f"{a}{s}_proj.weight"] for s in streams]).t()
        self.in_proj = b.matmul(f"{a}{{{','.join(streams)}}}_proj.weight", fused, "state_proj")
        del fused
        taps = [src[f"{a}{s}_conv1d.weight"].reshape(src.shape(f"{a}{s}_conv1d.weight")[0], -1).t() for s in "qkv"]
        self.conv_w = b.vector(f"{a}{{q,k,v}}_conv1d.weight", torch.cat(taps, 1), "conv")  # [W, D]
        if cfg.conv_bias:
            self.conv_b = b.vector(f"{a}{{q,k,v}}_conv1d.bias", torch.cat([src[f"{a}{s}_conv1d.bias"] for s in "qkv"]), "conv")
        self.neg_A = b.vector(a + "A_log", -torch.exp(src[a + "A_log"].float()), "decay")  # stored as -exp(A_log)
        self.dt_bias, self.o_norm = vec(a + "dt_bias"), vec(a + "o_norm.weight")
        self.o_proj = b.matmul(a + "o_proj.weight", src[a + "o_proj.weight"].t(), "out_proj")
        gate_up = torch.cat([src[m + "gate_proj.weight"], src[m + "up_proj.weight"]]).t()
        self.gate_up = b.matmul(m + "{gate,up}_proj.weight", gate_up, "ffn")
        del gate_up
        self.down = b.matmul(m + "down_proj.weight", src[m + "down_proj.weight"].t(), "ffn")

    def forward(self, x: torch.Tensor, slices: dict, step: Step):
        """x [T, C] fp32; rows >= valid_len (prefill) are padding: computed, never stored."""
        c = self.cfg
        H, HV, dk, dv = c.num_heads, c.num_v_heads, c.head_dim, c.head_v_dim
        T = x.shape[0]
        parts = self.in_proj(rms_norm(x, self.attn_norm, c.norm_eps)).split(self.in_split, dim=-1)
        qkv, new_conv = causal_conv(slices[CONV_STATE].float(), parts[0], self.conv_w, step.valid_len)
        if c.conv_bias:
            qkv = qkv + self.conv_b
        q, k, v = F.silu(qkv).split([c.key_dim, c.key_dim, c.value_dim], dim=-1)
        q = l2_normalize(q.reshape(T, H, dk), L2NORM_EPS) * dk**-0.5
        k = l2_normalize(k.reshape(T, H, dk), L2NORM_EPS)
        if c.group > 1:  # value head hv reads q/k head hv // group
            q = q.view(T, H, 1, dk).expand(T, H, c.group, dk).reshape(T, HV, dk)
            k = k.view(T, H, 1, dk).expand(T, H, c.group, dk).reshape(T, HV, dk)
        beta = torch.sigmoid(parts[2]).view(T, HV, 1, 1)
        if c.allow_neg_eigval:
            beta = beta * 2.0
        log_decay = self.neg_A * F.softplus(parts[1] + self.dt_bias)  # [T, HV]

        # The recurrence, in fp32 whatever the state dtype.
        v, S = v.reshape(T, HV, dv), slices[REC_STATE].float()
        if step.decode:
            o, S = delta_rule.decode(S, q.view(HV, dk), k.view(HV, dk), v.view(HV, dv), beta.view(HV, 1, 1),
                                     torch.exp(log_decay).view(HV, 1, 1))  # fmt: skip
            o = o.view(1, HV, dv)
        else:
            S, o = delta_rule.chunk(S, q, k, v, beta.view(T, HV), log_decay, step.valid_len, step.max_rows)
        o = rms_norm(o, self.o_norm, c.norm_eps).reshape(T, c.value_dim)
        if c.use_gate:
            o = o * F.silu(parts[3])
        x = x + self.o_proj(o)
        gate, up = self.gate_up(rms_norm(x, self.mlp_norm, c.norm_eps)).split([c.intermediate_size] * 2, dim=-1)
        return x + self.down(F.silu(gate) * up), {CONV_STATE: new_conv, REC_STATE: S}


def build(cfg: GatedDeltaNetConfig, src: TensorSource, b: WeightBuilder):
    embed = Embedding(b.table("model.embeddings.weight", src["model.embeddings.weight"], "embedding"))
    blocks = [GatedDeltaNetBlock(cfg, i, src, b) for i in range(cfg.num_layers)]
    norm = b.vector("model.norm.weight", src["model.norm.weight"], "norm")
    head = b.matmul("lm_head.weight", src["lm_head.weight"].t(), "head", out_dtype=b.recipe.logits_dtype)
    return embed, blocks, NormHead(head, norm, cfg.norm_eps)
