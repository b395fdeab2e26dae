"""The export form of a RecurrentGemma layer: the temporal block (conv + RG-LRU, or local
attention over a ring) and the gelu-gated MLP, each behind its (1 + w) RMSNorm, over T rows."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ssmport.loader.checkpoint import TensorSource
from ssmport.graph import Step
from ssmport.models.layers import CONV_STATES, RECURRENT_STATES, SLIDING_KEY_CACHE, SLIDING_VALUE_CACHE
from ssmport.models.layers.attention import AttentionMixer, norm_gain
from ssmport.models.layers.head import ScaledEmbedding, norm_head
from ssmport.models.recurrent_gemma.checkpoints import CONV_WEIGHT, EMBEDDING, FINAL_NORM, GATES, HEAD, attention, layer
from ssmport.models.recurrent_gemma.config import ATTENTION, RECURRENT, RecurrentGemmaConfig
from ssmport.models.recurrent_gemma.quant import role
from ssmport.ops import rglru
from ssmport.ops.conv import causal_conv
from ssmport.ops.norms import rms_norm
from ssmport.quant.plan import WeightBuilder
from ssmport.state import RING, StateSpec


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class Linear(nn.Module):
    """x @ W + b for the checkpoint nn.Linears `names` (several: one fused matmul, their rows stacked)."""

    def __init__(self, names: list[str], src: TensorSource, b: WeightBuilder):
        super().__init__()
        fused = names[0] if len(names) == 1 else "{" + ",".join(names) + "}"
        self.sizes = [src.shape(n + ".weight")[0] for n in names]
        self.w = b.matmul(fused + ".weight", torch.cat([src[n + ".weight"] for n in names]).t(), role(names[0] + ".weight"))
        self.b = b.vector(fused + ".bias", torch.cat([src[n + ".bias"] for n in names]), role(names[0] + ".bias"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w(x) + self.b


class RecurrentMixer(nn.Module):
    """out = linear_out(rglru(conv(linear_x h)) * gelu_tanh(linear_y h)). States: convStates
    [K-1, D] (the last K-1 conv inputs, oldest first) and recurrentStates [D]; fp32 math."""

    states = (CONV_STATES, RECURRENT_STATES)

    def __init__(self, cfg: RecurrentGemmaConfig, i: int, src: TensorSource, b: WeightBuilder):
        super().__init__()
        t = layer(i) + "temporal_block."
        heads, d = cfg.num_heads, cfg.lru_width // cfg.num_heads
        self.xy = Linear([t + "linear_x", t + "linear_y"], src, b)
        self.conv_w = b.vector(layer(i) + CONV_WEIGHT, src[layer(i) + CONV_WEIGHT].t(), role(CONV_WEIGHT))  # [K, D]
        self.conv_b = b.vector(t + "conv_1d.bias", src[t + "conv_1d.bias"], role(CONV_WEIGHT))
        names = [f"{t}rg_lru.{g}" for g in GATES]
        gates = torch.cat([src[n + "_weight"] for n in names], -1)  # [heads, d, 2d]: [W_i | W_r]
        self.gates = b.vector("{" + ",".join(n + "_weight" for n in names) + "}", gates, role(names[0]))
        bias = torch.cat([src[n + "_bias"] for n in names], -1).view(heads, 1, 2 * d)
        self.gate_bias = b.vector("{" + ",".join(n + "_bias" for n in names) + "}", bias, role(names[0]))
        lam = t + "rg_lru.recurrent_param"  # stored as C softplus(Λ): the same fp32 value transformers computes per call
        self.rate = b.vector(lam, rglru.DECAY_SCALE * F.softplus(src[lam].float()), role(lam))
        self.out = Linear([t + "linear_out"], src, b)

    def forward(self, h: torch.Tensor, slices: dict, step: Step):
        x, y = self.xy(h).split(self.xy.sizes, dim=-1)
        x, window = causal_conv(slices[CONV_STATES].float(), x, self.conv_w, step.valid_len)
        log_a, u, reset = rglru.gate(x + self.conv_b, self.gates, self.gate_bias, self.rate, step.positions)
        h0 = slices[RECURRENT_STATES].float()
        if step.decode:
            out = last = rglru.decode(h0, log_a, u, reset)
        else:
            out, last = rglru.chunk(h0, log_a, u, reset, step.valid_len, max_tokens=step.max_rows)
        return self.out(out * gelu_tanh(y)), {CONV_STATES: window, RECURRENT_STATES: last.view(-1)}


class GeluMLP(nn.Module):
    """down(gelu_tanh(gate h) * up h), gate and up fused in one matmul."""

    def __init__(self, i: int, src: TensorSource, b: WeightBuilder):
        super().__init__()
        m = layer(i) + "mlp_block."
        self.gate_up, self.down = Linear([m + "gate_proj", m + "up_proj"], src, b), Linear([m + "down_proj"], src, b)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_up(h).split(self.gate_up.sizes, dim=-1)
        return self.down(gelu_tanh(g) * u)


class RecurrentGemmaLayer(nn.Module):
    """x + temporal(norm(x)), then x + mlp(norm(x)); norms of gain 1 + w. Its states are its temporal block's."""

    def __init__(self, cfg: RecurrentGemmaConfig, i: int, src: TensorSource, b: WeightBuilder):
        super().__init__()
        p, self.eps = layer(i), cfg.norm_eps
        gain = lambda n: b.vector(p + n, norm_gain(src[p + n], "rms_offset"), role(p + n))  # noqa: E731
        self.temporal_norm, self.channel_norm = gain("temporal_pre_norm.weight"), gain("channel_pre_norm.weight")
        self.op = RecurrentMixer(cfg, i, src, b) if cfg.layer_types[i] == RECURRENT else LocalAttention(cfg, i, src, b)
        self.states, self.mlp = self.op.states, GeluMLP(i, src, b)

    def forward(self, x: torch.Tensor, slices: dict, step: Step):
        out, states = self.op(rms_norm(x, self.temporal_norm, self.eps), slices, step)
        x = x + out
        return x + self.mlp(rms_norm(x, self.channel_norm, self.eps)), states


class SoftCappedHead(nn.Module):
    """cap * tanh(head(x) / cap), in fp32, back in the head's dtype."""

    def __init__(self, head: nn.Module, cap: float):
        super().__init__()
        self.head, self.cap = head, cap

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.head(x)
        return (torch.tanh(logits.float() / self.cap) * self.cap).to(logits.dtype)


def build(cfg: RecurrentGemmaConfig, src: TensorSource, b: WeightBuilder):
    embed = ScaledEmbedding(b.table(EMBEDDING, src[EMBEDDING], role(EMBEDDING)), cfg.embed_scale)
    blocks = [RecurrentGemmaLayer(cfg, i, src, b) for i in range(cfg.num_layers)]
    head = norm_head(src, b, HEAD, FINAL_NORM, cfg.norm_eps, gain=norm_gain(src[FINAL_NORM], "rms_offset"))
    return embed, blocks, SoftCappedHead(head, cfg.logits_soft_cap)



class LocalAttention(nn.Module):
    """GQA over the ring of the last `window` positions (ssmport.models.layers.AttentionMixer
    with the spec's window); o_proj's bias, which transformers always has, added here when
    q/k/v have none (the mixer's biases are all or nothing)."""

    def __init__(self, cfg: RecurrentGemmaConfig, i: int, src: TensorSource, b: WeightBuilder):
        super().__init__()
        names = attention(cfg, i)
        self.mixer = AttentionMixer(cfg.attention, names, src, b)
        self.states = self.mixer.states
        self.o_bias = None if cfg.attention_bias else b.vector(names.o_bias, src[names.o_bias], role(names.o_bias))

    def forward(self, h: torch.Tensor, slices: dict, step: Step):
        out, states = self.mixer(h, slices, step)
        return (out if self.o_bias is None else out + self.o_bias), states


def ring_specs(cfg: RecurrentGemmaConfig, dtype: torch.dtype) -> list[StateSpec]:
    """The attention layers' K and V rings [L_attn, 1, kv_heads, window, head_dim]: slot p mod
    window holds position p's row (K after RoPE)."""
    n = cfg.layers_of(ATTENTION)
    if not n:
        return []
    shape, axes = (n, 1, cfg.num_kv_heads, cfg.window, cfg.head_dim), "[attention layer, batch, kv head, slot, head_dim]"
    return [StateSpec(SLIDING_KEY_CACHE, shape, dtype, axes + " (K after RoPE)", RING),
            StateSpec(SLIDING_VALUE_CACHE, shape, dtype, axes, RING)]  # fmt: skip
