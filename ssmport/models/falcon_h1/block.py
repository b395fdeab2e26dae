"""The export form of a Falcon-H1 layer: attention (ssmport.models.layers) and Mamba-2
(ssmport.models.mamba2) side by side on the same normed input, their outputs summed, then the
SwiGLU MLP; every layer holds a KV pair and a conv + SSM state.

The µP multipliers other than the embedding's are folded into the weights they scale when
the weights are read (`folded`): a scalar or per-row factor on a linear map is the same map
with scaled rows (transformers multiplies each one's input or output), so the shared layers
run unchanged and the graph has no extra op. The cached K rows are k_proj(h) * key_multiplier,
as transformers caches them."""

from __future__ import annotations

import torch
from torch import nn

from ssmport.loader.checkpoint import MappedSource, TensorSource
from ssmport.graph import Step
from ssmport.models.falcon_h1.checkpoints import EMBEDDING, FINAL_NORM, HEAD, attention, layer, mlp
from ssmport.models.falcon_h1.config import FalconH1Config
from ssmport.models.falcon_h1.quant import role
from ssmport.models.layers.attention import AttentionMixer
from ssmport.models.layers.head import ScaledEmbedding, norm_head
from ssmport.models.layers.mamba2_mixer import Mamba2StateMixer
from ssmport.models.layers.mlp import SwiGLU
from ssmport.ops.norms import rms_norm
from ssmport.quant.plan import WeightBuilder


def multipliers(cfg: FalconH1Config) -> dict[str, float | torch.Tensor]:
    """canonical name -> the factor transformers applies to that linear map (a scalar, or one
    value per output row), for every scaled weight and bias."""
    a, s, (gate_m, down_m) = cfg.attention_in_multiplier, torch.tensor(cfg.ssm_scale), cfg.mlp_multipliers
    mup = s / cfg.ssm_in_multiplier  # the bias is added after the input multiplier, before the µP vector
    out: dict[str, float | torch.Tensor] = {}
    for i in range(cfg.num_layers):
        m, n, (gate, _, down) = layer(i) + "mamba.", attention(cfg, i), mlp(i)
        out |= {m + "in_proj.weight": s, m + "in_proj.bias": mup, m + "out_proj.weight": cfg.ssm_out_multiplier,
                m + "out_proj.bias": cfg.ssm_out_multiplier, n.q: a, n.k: a * cfg.key_multiplier, n.v: a,
                n.o: cfg.attention_out_multiplier, gate: gate_m, down: down_m}  # fmt: skip
        if cfg.attention_bias:
            out |= {n.k_bias: cfg.key_multiplier, n.o_bias: cfg.attention_out_multiplier}
    return out


def folded(cfg: FalconH1Config, src: TensorSource) -> TensorSource:
    """`src` with each multiplier of `multipliers` applied to its weight's rows."""
    factors = multipliers(cfg)

    def scaled(name: str):
        f = factors.get(name, 1.0)
        if isinstance(f, torch.Tensor):
            return lambda t: t.float() * f.to(t.device).view(-1, *([1] * (t.dim() - 1)))  # t may be meta
        return lambda t: t.float() * f

    return MappedSource(src, {n: (n, scaled(n)) for n in src}, src.shapes())


class FalconH1Layer(nn.Module):
    """h = rmsnorm(x); x + attention(h) + mamba(h), then x + mlp(rmsnorm(x)) (multipliers folded)."""

    def __init__(self, cfg: FalconH1Config, i: int, src: TensorSource, b: WeightBuilder):
        super().__init__()
        p, self.eps = layer(i), cfg.norm_eps
        vec = lambda n: b.vector(n, src[n], role(n))  # noqa: E731
        self.in_norm, self.mlp_norm = vec(p + "input_layernorm.weight"), vec(p + "pre_ff_layernorm.weight")
        self.attention = AttentionMixer(cfg.attention, attention(cfg, i), src, b)
        self.mamba = Mamba2StateMixer(cfg.mixer, p + "mamba.", src, b, role)
        self.states = self.attention.states + self.mamba.states
        self.mlp = SwiGLU(*mlp(i), src, b)

    def forward(self, x: torch.Tensor, slices: dict, step: Step):
        h = rms_norm(x, self.in_norm, self.eps)
        attn, kv = self.attention(h, slices, step)
        ssm, recurrent = self.mamba(h, slices, step)
        x = x + attn + ssm
        return x + self.mlp(rms_norm(x, self.mlp_norm, self.eps)), kv | recurrent


def build(cfg: FalconH1Config, src: TensorSource, b: WeightBuilder):
    """(embedding, blocks, head). lm_head_multiplier is folded into the final norm's gain
    (lm_head(w * x̂) * m = lm_head((w * m) * x̂))."""
    embed = ScaledEmbedding(b.table(EMBEDDING, src[EMBEDDING], role(EMBEDDING)), cfg.embedding_multiplier)
    scaled = folded(cfg, src)
    blocks = [FalconH1Layer(cfg, i, scaled, b) for i in range(cfg.num_layers)]
    gain = src[FINAL_NORM].float() * cfg.lm_head_multiplier
    return embed, blocks, norm_head(src, b, HEAD, FINAL_NORM, cfg.norm_eps, gain=gain)
