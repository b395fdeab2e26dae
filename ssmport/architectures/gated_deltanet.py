"""Gated DeltaNet (fla `GatedDeltaNetForCausalLM`): config, states, reference step, decode module.

Per layer and token, with H query/key heads of size dk and HV value heads of size dv
(value head hv reads q/k head hv // (HV / H): grouped value attention when HV > H):

    q, k, v = silu(causal_conv4(x W_q)), ...          depthwise short convs, one per stream
    beta = sigmoid(x W_b)  (x2 with allow_neg_eigval)  g = -exp(A_log) * softplus(x W_a + dt_bias)
    q, k = l2norm(q), l2norm(k);  q *= dk^-0.5
    S = S * exp(g);  u = beta * (v - S^T k);  S = S + k u^T;  o = S^T q        S: [dk, dv] per hv
    out = o_proj(rmsnorm(o) * w * silu(x W_g))        RMSNorm first, then the gate

around it a pre-norm residual block with a SwiGLU MLP. Sources: fla's `fla/layers/gated_deltanet.py`,
`fla/ops/gated_delta_rule/naive.py`, `fla/modules/{conv/short_conv,fused_norm_gate,mlp}.py` and
`fla/models/gated_deltanet/` for the math, config keys and weight names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ssmport.architectures.base import Architecture, Preset
from ssmport.causal_conv import causal_conv
from ssmport.checkpoint import GeneratedSource, MappedSource, TensorSource, check_strict
from ssmport.errors import CheckpointError
from ssmport.prefill import last_valid
from ssmport.quant.plan import WeightBuilder
from ssmport.state import StateSpec, read_layer, register_states, stack_rows, write_once

L2NORM_EPS = 1e-6  # fla's in-kernel q/k normalisation: x / sqrt(sum(x^2) + 1e-6)
CONV_STATE = "convState"
REC_STATE = "recState"
IN_PROJ = ("q", "k", "v", "a", "b", "g")  # the six projections of the normed input, fused in one matmul

# GatedDeltaNetConfig's defaults in fla: a key missing from config.json takes these.
FLA_DEFAULTS: dict[str, Any] = {
    "hidden_size": 2048, "expand_v": 2.0, "use_gate": True, "use_short_conv": True,
    "allow_neg_eigval": False, "conv_size": 4, "head_dim": 256, "num_heads": 6, "num_v_heads": None,
    "hidden_ratio": 4, "intermediate_size": None, "hidden_act": "swish", "num_hidden_layers": 21,
    "norm_eps": 1e-6, "vocab_size": 32000, "tie_word_embeddings": False,
}  # fmt: skip


@dataclass(frozen=True)
class GatedDeltaNetConfig:
    vocab_size: int
    hidden_size: int  # C
    num_layers: int  # L
    num_heads: int  # H: query/key heads
    head_dim: int  # dk
    num_v_heads: int  # HV: value heads, a multiple of H
    head_v_dim: int  # dv = head_dim * expand_v
    intermediate_size: int  # F of the SwiGLU MLP
    conv_size: int = 4  # W of the depthwise causal convs
    conv_bias: bool = False
    use_gate: bool = True  # output gate silu(x W_g) after the head-wise RMSNorm
    allow_neg_eigval: bool = False  # beta in (0, 2) instead of (0, 1)
    norm_eps: float = 1e-6

    @property
    def key_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:  # channels of the three short convs, in q | k | v order
        return 2 * self.key_dim + self.value_dim

    @property
    def group(self) -> int:  # value heads per query/key head
        return self.num_v_heads // self.num_heads

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def validate(self) -> None:
        if self.num_v_heads % self.num_heads:
            raise CheckpointError(f"num_v_heads={self.num_v_heads} is not a multiple of num_heads={self.num_heads}")
        if self.conv_size < 2:
            raise CheckpointError(f"conv_size={self.conv_size}: the short convolution needs a kernel of at least 2")


def _fla_mlp_size(hidden: int, ratio: float | None) -> int:
    """fla's GatedMLP: 2/3 of hidden * ratio, rounded up to a multiple of 256."""
    size = int(hidden * (ratio or 4) * 2 / 3)
    return 256 * ((size + 255) // 256)


def _preset(name: str, description: str, released: bool, **config) -> Preset:
    return Preset(name, "gated_deltanet", config, description, released)


# fla/flame's published training configs (configs/gated_deltanet_{340M,1B}.json): 21 layers,
# 6 heads of 256, expand_v 2, Llama-2 vocab; the "1B" config is the 1.3B of the GDN paper.
# No Hub release of exactly these configs was found, so they have no download source (pass
# --weights). The published GDN checkpoints found (m-a-p/1.3B-100B-GatedDeltaNet-pure,
# m-a-p/340M-20B-GatedDeltaNet-pure-baseline, linear-moe-hub/Gated-Deltanet-{340M,1.3B}) have
# other shapes; `ssmport export ORG/REPO` reads theirs from config.json.
PRESETS = (
    _preset("gated-deltanet-340m", "fla Gated DeltaNet 340M (L21 C1024, 6x256 heads, dv 512)", True,
            vocab_size=32000, hidden_size=1024, num_layers=21, num_heads=6, head_dim=256, num_v_heads=6,
            head_v_dim=512, intermediate_size=_fla_mlp_size(1024, 4)),
    _preset("gated-deltanet-1.3b", "fla Gated DeltaNet 1.3B (L21 C2048, 6x256 heads, dv 512)", True,
            vocab_size=32000, hidden_size=2048, num_layers=21, num_heads=6, head_dim=256, num_v_heads=6,
            head_v_dim=512, intermediate_size=_fla_mlp_size(2048, 4)),
    _preset("gated-deltanet-tiny", "test model: L2 C128, 2 q/k heads of 32, 4 value heads of 48 (GVA, dv != dk)",
            False, vocab_size=512, hidden_size=128, num_layers=2, num_heads=2, head_dim=32, num_v_heads=4,
            head_v_dim=48, intermediate_size=256),
)  # fmt: skip


# --------------------------------------------------------------------------------------
# Canonical weights: fla's names and shapes (nn.Linear [out, in], conv [D, 1, W]).
# --------------------------------------------------------------------------------------


def _layer(i: int) -> str:
    return f"model.layers.{i}."


def canonical_shapes(cfg: GatedDeltaNetConfig) -> dict[str, tuple[int, ...]]:
    C, Kd, Vd, HV, W = cfg.hidden_size, cfg.key_dim, cfg.value_dim, cfg.num_v_heads, cfg.conv_size
    shapes: dict[str, tuple[int, ...]] = {"model.embeddings.weight": (cfg.vocab_size, C)}
    for i in range(cfg.num_layers):
        p, a, m = _layer(i), _layer(i) + "attn.", _layer(i) + "mlp."
        shapes |= {p + "attn_norm.weight": (C,), p + "mlp_norm.weight": (C,)}
        shapes |= {a + "q_proj.weight": (Kd, C), a + "k_proj.weight": (Kd, C), a + "v_proj.weight": (Vd, C),
                   a + "a_proj.weight": (HV, C), a + "b_proj.weight": (HV, C),
                   a + "A_log": (HV,), a + "dt_bias": (HV,), a + "o_norm.weight": (cfg.head_v_dim,),
                   a + "o_proj.weight": (C, Vd)}  # fmt: skip
        for stream, width in (("q", Kd), ("k", Kd), ("v", Vd)):
            shapes[f"{a}{stream}_conv1d.weight"] = (width, 1, W)
            if cfg.conv_bias:
                shapes[f"{a}{stream}_conv1d.bias"] = (width,)
        if cfg.use_gate:
            shapes[a + "g_proj.weight"] = (Vd, C)
        F_ = cfg.intermediate_size
        shapes |= {m + "gate_proj.weight": (F_, C), m + "up_proj.weight": (F_, C), m + "down_proj.weight": (C, F_)}
    shapes |= {"model.norm.weight": (C,), "lm_head.weight": (cfg.vocab_size, C)}
    return shapes


def _role(name: str) -> str:
    """Plan category of a canonical weight name (fused names like `attn.{q,k,v}_proj` too)."""
    if name == "model.embeddings.weight":
        return "embedding"
    if name == "lm_head.weight":
        return "head"
    if ".mlp." in name:
        return "ffn"
    if ".attn.o_proj." in name:
        return "out_proj"
    if ".attn." in name and "_proj" in name:
        return "state_proj"  # q/k/v/a/b/g: everything the recurrence reads
    if "_conv1d." in name:
        return "conv"
    if name.endswith(("A_log", "dt_bias")):
        return "decay"
    return "norm"


# What the recurrence reads (q/k/v/a/b/g projections, convs, A_log, dt_bias), the norms, and
# o_proj (as RWKV-7 keeps its output projection) stay float under int8keepproj; the SwiGLU MLP
# and the LM head (the weight bulk) are int8. Measured with the gate: docs/parity.md.
KEEP_FLOAT_ROLES = frozenset({"state_proj", "out_proj", "conv", "decay", "norm", "embedding"})


# --------------------------------------------------------------------------------------
# fla config.json
# --------------------------------------------------------------------------------------


def _config_from_fla(cj: Mapping[str, Any], source: TensorSource) -> GatedDeltaNetConfig:
    def unsupported(what: str) -> CheckpointError:
        return CheckpointError(f"{source.origin}: Gated DeltaNet config with {what} is not supported")

    c = FLA_DEFAULTS | {k: v for k, v in cj.items() if v is not None or k in ("num_v_heads", "intermediate_size")}
    if cj.get("attn") not in (None, {}):
        raise unsupported("hybrid attention layers ('attn')")
    if cj.get("attnres_block_size") is not None:
        raise unsupported("attention residuals ('attnres_block_size')")
    if c["hidden_act"] != "swish":
        raise unsupported(f"hidden_act={c['hidden_act']!r}")
    if not c["use_short_conv"]:
        raise unsupported("use_short_conv=false")
    try:
        width, head_dim = int(c["hidden_size"]), int(c["head_dim"])
        heads = int(c["num_heads"])
        v_heads = int(c["num_v_heads"] or heads)
        expand_v = float(c["expand_v"])
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{source.origin}: config.json has an invalid size ({exc})") from None
    head_v_dim = int(head_dim * expand_v)
    if not math.isclose(head_dim * expand_v, head_v_dim, rel_tol=1e-5):
        raise CheckpointError(f"{source.origin}: expand_v={expand_v} gives a fractional value head size")
    ffn = c["intermediate_size"]
    emb = "model.embeddings.weight"
    return GatedDeltaNetConfig(
        vocab_size=int(cj["vocab_size"]) if "vocab_size" in cj else (source.shape(emb)[0] if emb in source else 32000),
        hidden_size=width,
        num_layers=int(c["num_hidden_layers"]),
        num_heads=heads,
        head_dim=head_dim,
        num_v_heads=v_heads,
        head_v_dim=head_v_dim,
        intermediate_size=int(ffn) if ffn is not None else _fla_mlp_size(width, c["hidden_ratio"]),
        conv_size=int(c["conv_size"]),
        # fla's model never passes conv_bias to its layers; the weights say whether they have one.
        conv_bias="model.layers.0.attn.q_conv1d.bias" in source,
        use_gate=bool(c["use_gate"]),
        allow_neg_eigval=bool(c["allow_neg_eigval"]),
        norm_eps=float(c["norm_eps"]),
    )


# --------------------------------------------------------------------------------------
# Synthetic weights (fla's init ranges where they matter for the recurrence)
# --------------------------------------------------------------------------------------


def _synthetic_init(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    randn = torch.randn(shape, generator=g)
    if name.endswith("A_log"):  # A ~ U(1, 16), fla's range
        return torch.log(1 + 15 * torch.rand(shape, generator=g))
    if name.endswith("dt_bias"):  # softplus^-1 of dt ~ logU(1e-3, 1e-1), fla's init
        dt = torch.exp(torch.rand(shape, generator=g) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        return dt + torch.log(-torch.expm1(-dt))
    if "_conv1d." in name:
        return 0.5 * randn if name.endswith(".weight") else 0.1 * randn
    if len(shape) == 1:  # norm gains
        return 1.0 + 0.1 * randn
    if name == "model.embeddings.weight":
        return randn
    if name == "lm_head.weight":
        return randn * (2.0 / math.sqrt(shape[1]))
    return randn / math.sqrt(shape[1])  # projections [out, in]


# --------------------------------------------------------------------------------------
# The reference step: plain fp32, one value head at a time, written for reading.
# --------------------------------------------------------------------------------------


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class GatedDeltaNetReference:
    """One token at a time, per value head, with nothing fused: the spec for every other form."""

    def __init__(self, cfg: GatedDeltaNetConfig, weights: TensorSource):
        self.cfg = cfg
        self.w = {name: weights[name].float() for name in canonical_shapes(cfg)}

    def zero_state(self) -> dict[str, list]:
        c = self.cfg
        widths = {"q": c.key_dim, "k": c.key_dim, "v": c.value_dim}
        return {
            # the last W-1 inputs of each short conv, oldest first
            "conv": [{s: torch.zeros(c.conv_size - 1, d) for s, d in widths.items()} for _ in range(c.num_layers)],
            "S": [torch.zeros(c.num_v_heads, c.head_dim, c.head_v_dim) for _ in range(c.num_layers)],
        }

    def step(self, token: int, state: dict[str, list]) -> torch.Tensor:
        c, w = self.cfg, self.w
        x = w["model.embeddings.weight"][token]
        for i in range(c.num_layers):
            p = _layer(i)
            x = x + self._attention(i, _rms_norm(x, w[p + "attn_norm.weight"], c.norm_eps), state)
            h = _rms_norm(x, w[p + "mlp_norm.weight"], c.norm_eps)
            m = p + "mlp."
            x = x + w[m + "down_proj.weight"] @ (F.silu(w[m + "gate_proj.weight"] @ h) * (w[m + "up_proj.weight"] @ h))
        x = _rms_norm(x, w["model.norm.weight"], c.norm_eps)
        return w["lm_head.weight"] @ x

    def _short_conv(self, i: int, stream: str, x: torch.Tensor, state) -> torch.Tensor:
        a = _layer(i) + "attn."
        past = state["conv"][i][stream]
        window = torch.cat([past, x[None]])  # [W, D], oldest first
        state["conv"][i][stream] = window[1:]
        y = (window * _conv_taps(self.w[f"{a}{stream}_conv1d.weight"])).sum(0)
        if self.cfg.conv_bias:
            y = y + self.w[f"{a}{stream}_conv1d.bias"]
        return F.silu(y)

    def _attention(self, i: int, x: torch.Tensor, state) -> torch.Tensor:
        c, w, a = self.cfg, self.w, _layer(i) + "attn."
        q = self._short_conv(i, "q", w[a + "q_proj.weight"] @ x, state)
        k = self._short_conv(i, "k", w[a + "k_proj.weight"] @ x, state)
        v = self._short_conv(i, "v", w[a + "v_proj.weight"] @ x, state)
        beta = torch.sigmoid(w[a + "b_proj.weight"] @ x) * (2.0 if c.allow_neg_eigval else 1.0)
        g = -torch.exp(w[a + "A_log"]) * F.softplus(w[a + "a_proj.weight"] @ x + w[a + "dt_bias"])
        gate = w[a + "g_proj.weight"] @ x if c.use_gate else None

        out = torch.empty(c.value_dim)
        S = state["S"][i]  # [HV, dk, dv]
        for hv in range(c.num_v_heads):
            h = hv // c.group  # the query/key head this value head reads
            qh = q[h * c.head_dim : (h + 1) * c.head_dim]
            kh = k[h * c.head_dim : (h + 1) * c.head_dim]
            qh = qh / torch.sqrt((qh * qh).sum() + L2NORM_EPS) * c.head_dim**-0.5
            kh = kh / torch.sqrt((kh * kh).sum() + L2NORM_EPS)
            vs = slice(hv * c.head_v_dim, (hv + 1) * c.head_v_dim)
            s = S[hv] * torch.exp(g[hv])
            u = beta[hv] * (v[vs] - s.t() @ kh)
            s = s + torch.outer(kh, u)
            S[hv] = s
            o = _rms_norm(s.t() @ qh, w[a + "o_norm.weight"], c.norm_eps)
            out[vs] = o * F.silu(gate[vs]) if c.use_gate else o
        return w[a + "o_proj.weight"] @ out


def _conv_taps(conv_weight: torch.Tensor) -> torch.Tensor:
    """fla's depthwise conv weight [D, 1, W] as [W, D], tap j applying to the input W-1-j steps back."""
    return conv_weight.reshape(conv_weight.shape[0], -1).t()


# --------------------------------------------------------------------------------------
# The export form: one token, fused projections, batched per-head matmuls, one write per state.
# --------------------------------------------------------------------------------------


def delta_rule_step(S, q, k, v, beta, decay):
    """One gated delta-rule step for all value heads at once, as batched matmuls.

    S [HV, dk, dv]; q, k [HV, dk] (normalised, q scaled); v [HV, dv]; beta, decay [HV, 1, 1].
    Returns (S', o [HV, dv]): the one-step form (benchmarks/gdn_composite.py; decode runs its
    reads and defers the update, prefill the chunkwise form). Both reads of
    the state happen before the update, in one matmul: with S_d = decay * S and S' = S_d + k u^T,
        k^T S_d = decay * (k^T S)        and        q^T S' = decay * (q^T S) + (q . k) u,
    so the [HV, dk, dv] state (the bulk of the memory traffic) is read once and written once.
    """
    HV, dk, dv = S.shape
    o, u = _delta_rule_reads(S, q, k, v, beta, decay)
    S = S * decay + k.view(HV, dk, 1) * u
    return S, o


def _delta_rule_reads(S, q, k, v, beta, decay):
    """What a step needs from the old state S: (o [HV, dv], u [HV, 1, dv]); see delta_rule_step."""
    HV, dk, dv = S.shape
    qk_S = torch.stack([q, k], dim=1) @ S  # [HV, 2, dv]: q^T S and k^T S
    q_S, k_S = qk_S[:, 0:1], qk_S[:, 1:2]
    u = beta * (v.view(HV, 1, dv) - decay * k_S)  # [HV, 1, dv]
    o = decay * q_S + (q * k).sum(-1).view(HV, 1, 1) * u
    return o.view(HV, dv), u


def delta_rule_chunk(S0, q, k, v, beta, log_decay, valid_len):
    """The gated delta rule over a chunk of T tokens in its chunkwise (WY) form: matmuls, no loop.

    S0 [HV,dk,dv] fp32; q, k [T,HV,dk] (normalised, q scaled); v [T,HV,dv]; beta and
    log_decay = log g [T,HV]. Per head, with cum[t] the prefix sum of log g and
    D[t,s] = exp(cum[t] - cum[s]) for s <= t, the step S_t = g_t S_{t-1} + k_t u_t^T,
    u_t = beta_t (v_t - g_t S_{t-1}^T k_t), o_t = S_t^T q_t unrolls to

        (I + L) U = beta (V - exp(cum) K S0),   L[t,s] = beta_t D[t,s] (k_t . k_s) for s < t
        O   = exp(cum) Q S0 + (D o Q K^T) U
        S_T = exp(cum[T-1]) S0 + K^T (D[T-1, :] U)

    L is strictly lower triangular, so (I + L)^-1 = (I - L)(I + L^2)(I + L^4)... with
    ceil(log2 T) factors: exact in exact arithmetic, and only T x T matmuls. Rows t >= valid_len
    are padding: beta = 0 and g = 1 there, so they change nothing. Returns (S_T, O [T,HV,dv]).
    """
    T = q.shape[0]
    dtype = S0.dtype
    real = (torch.arange(T) < valid_len).to(dtype).view(T, 1)
    beta, log_decay = beta * real, log_decay * real
    up_to = torch.tril(torch.ones(T, T, dtype=dtype))  # up_to[t, s] = s <= t
    eye = torch.eye(T, dtype=dtype)
    cum = (up_to @ log_decay).t()  # [HV, T]
    D = torch.exp((cum.unsqueeze(2) - cum.unsqueeze(1)) * up_to) * up_to  # [HV, T, T]; 0 above the diagonal
    Q, K, V = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [HV, T, d]
    B = beta.t().unsqueeze(2)  # [HV, T, 1]
    G = torch.exp(cum).unsqueeze(2)  # [HV, T, 1]
    minus_L = -B * (K @ K.transpose(1, 2)) * D * (up_to - eye)
    inverse, power = eye + minus_L, minus_L
    for _ in range(max(0, math.ceil(math.log2(T)) - 1)):
        power = power @ power
        inverse = inverse @ (eye + power)
    U = inverse @ (B * (V - G * (K @ S0)))  # [HV, T, dv]
    O = G * (Q @ S0) + ((Q @ K.transpose(1, 2)) * D) @ U
    to_end = D[:, T - 1, :].unsqueeze(2)  # [HV, T, 1]: exp(cum[T-1] - cum[s])
    S = torch.exp(cum[:, T - 1]).view(-1, 1, 1) * S0 + (K * to_end).transpose(1, 2) @ U
    return S, O.transpose(0, 1).contiguous()


class DeltaUpdate(NamedTuple):
    """One layer's decode step, applied to its state slice later (`update_rec`)."""

    decay: torch.Tensor  # [HV, 1, 1]
    k: torch.Tensor  # [HV, dk]
    u: torch.Tensor  # [HV, 1, dv]


def delta_rule_decode(S, q, k, v, beta, decay):
    """Decode's step without forming S' (the stack forms it for all layers at once, so each
    state is written once as a whole). Arguments as in delta_rule_step. Returns (o [HV, dv],
    the DeltaUpdate)."""
    o, u = _delta_rule_reads(S, q, k, v, beta, decay)
    return o, DeltaUpdate(decay, k, u)


class _Layer(nn.Module):
    def __init__(self, cfg: GatedDeltaNetConfig, i: int, src: TensorSource, b: WeightBuilder):
        super().__init__()
        self.cfg = cfg
        p, a, m = _layer(i), _layer(i) + "attn.", _layer(i) + "mlp."
        vec = lambda n: b.vector(n, src[n], _role(n))  # noqa: E731
        self.attn_norm, self.mlp_norm = vec(p + "attn_norm.weight"), vec(p + "mlp_norm.weight")

        # q, k, v, a, b (and g) all read the normed input: one [C, sum(out)] matmul, split after.
        streams = [s for s in IN_PROJ if s != "g" or cfg.use_gate]
        sizes = [src.shape(f"{a}{s}_proj.weight")[0] for s in streams]
        self.in_split = [sum(sizes[:3]), *sizes[3:]]  # q|k|v (conv input), a, b, (g)
        fused = torch.cat([src[f"{a}{s}_proj.weight"] for s in streams]).t()
        self.in_proj = b.matmul(f"{a}{{{','.join(streams)}}}_proj.weight", fused, "state_proj")
        del fused
        convs = [f"{a}{s}_conv1d.weight" for s in "qkv"]
        self.conv_w = b.vector(f"{a}{{q,k,v}}_conv1d.weight", torch.cat([_conv_taps(src[n]) for n in convs], 1), "conv")
        if cfg.conv_bias:
            self.conv_b = b.vector(f"{a}{{q,k,v}}_conv1d.bias", torch.cat([src[f"{a}{s}_conv1d.bias"] for s in "qkv"]), "conv")
        self.neg_A = b.vector(a + "A_log", -torch.exp(src[a + "A_log"].float()), "decay")  # stored as -exp(A_log)
        self.dt_bias = vec(a + "dt_bias")
        self.o_norm = vec(a + "o_norm.weight")
        self.o_proj = b.matmul(a + "o_proj.weight", src[a + "o_proj.weight"].t(), "out_proj")

        self.ffn_size = cfg.intermediate_size
        gate_up = torch.cat([src[m + "gate_proj.weight"], src[m + "up_proj.weight"]]).t()
        self.gate_up = b.matmul(m + "{gate,up}_proj.weight", gate_up, "ffn")
        del gate_up
        self.down = b.matmul(m + "down_proj.weight", src[m + "down_proj.weight"].t(), "ffn")

    def forward(self, x: torch.Tensor, conv: torch.Tensor, S: torch.Tensor, valid_len: torch.Tensor | None = None):
        """One layer over T tokens.

        x [T,C] fp32; conv [W-1, D] and S [HV, dk, dv] in the state dtype. Decode passes T=1
        and valid_len None; prefill passes a chunk and valid_len int32 [1] (rows >= valid_len
        are padding: computed, never stored). Returns x, the new conv slice, and the new S
        slice (prefill) or the `DeltaUpdate` to apply later (decode).
        """
        c = self.cfg
        H, HV, dk, dv = c.num_heads, c.num_v_heads, c.head_dim, c.head_v_dim
        T = x.shape[0]
        h = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + c.norm_eps) * self.attn_norm
        parts = self.in_proj(h).split(self.in_split, dim=-1)  # q|k|v as one part: no concat
        qkv, a, beta_in = parts[0], parts[1], parts[2]

        qkv, new_conv = causal_conv(conv.float(), qkv, self.conv_w, valid_len)  # new_conv: last W-1 inputs
        if c.conv_bias:
            qkv = qkv + self.conv_b
        q, k, v = F.silu(qkv).split([c.key_dim, c.key_dim, c.value_dim], dim=-1)

        q = q.reshape(T, H, dk)
        k = k.reshape(T, H, dk)
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + L2NORM_EPS) * dk**-0.5
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + L2NORM_EPS)
        if c.group > 1:  # value head hv reads q/k head hv // group
            q = q.view(T, H, 1, dk).expand(T, H, c.group, dk).reshape(T, HV, dk)
            k = k.view(T, H, 1, dk).expand(T, H, c.group, dk).reshape(T, HV, dk)
        beta = torch.sigmoid(beta_in).view(T, HV, 1, 1)
        if c.allow_neg_eigval:
            beta = beta * 2.0
        log_decay = self.neg_A * F.softplus(a + self.dt_bias)  # [T, HV]

        # The recurrence, in fp32 whatever the state dtype.
        v = v.reshape(T, HV, dv)
        if valid_len is None:
            o, S = delta_rule_decode(S.float(), q.view(HV, dk), k.view(HV, dk), v.view(HV, dv), beta.view(HV, 1, 1),
                                     torch.exp(log_decay).view(HV, 1, 1))  # fmt: skip
            o = o.view(1, HV, dv)
        else:
            S, o = delta_rule_chunk(S.float(), q, k, v, beta.view(T, HV), log_decay, valid_len)

        o = o * torch.rsqrt((o * o).mean(-1, keepdim=True) + c.norm_eps) * self.o_norm
        o = o.reshape(T, c.value_dim)
        if c.use_gate:
            o = o * F.silu(parts[3])
        x = x + self.o_proj(o)

        h = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + c.norm_eps) * self.mlp_norm
        gate, up = self.gate_up(h).split([self.ffn_size, self.ffn_size], dim=-1)
        x = x + self.down(F.silu(gate) * up)
        return x, new_conv, S


class _GatedDeltaNetStack(nn.Module):
    """What decode and prefill share: embedding, layers, final norm, head, and the state writes.

    Subclasses set emb, layers, norm, head and register the two states.
    """

    cfg: GatedDeltaNetConfig

    def run_layers(self, ids: torch.Tensor, valid_len: torch.Tensor | None) -> torch.Tensor:
        """Embed `ids` [T], run every layer, write both states once; return x [T, C]."""
        x = F.embedding(ids, self.emb).float()  # [T, C]
        convs: list[torch.Tensor] = []
        recs: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            x, conv, S = layer(x, read_layer(self.convState, i)[0], read_layer(self.recState, i)[0], valid_len)
            convs.append(conv)
            recs.append(S)
        write_once(self.convState, convs)
        if valid_len is None:
            self.update_rec(recs)
        else:
            write_once(self.recState, recs)
        return x

    def update_rec(self, updates: list[DeltaUpdate]) -> None:
        """recState <- every layer's S' = S*decay + k u^T, as two elementwise ops over the whole
        [L, HV, dk, dv] state and one write. Writing the layers' new slices one by one copies
        the whole state per layer on this runtime (21 x 66 MB per token at 340m)."""
        c = self.cfg
        L, HV, dk, dv = c.num_layers, c.num_v_heads, c.head_dim, c.head_v_dim
        decay, k, u = (stack_rows(list(f)) for f in zip(*updates))
        S = self.recState.float().view(L, HV, dk, dv)
        S = S * decay.view(L, HV, 1, 1) + k.view(L, HV, dk, 1) * u.view(L, HV, 1, dv)
        self.recState.copy_(S.view(self.recState.shape).to(self.recState.dtype))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final RMSNorm and LM head on rows x [R, C] -> [R, V]."""
        return self.head(x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.cfg.norm_eps) * self.norm)


class GatedDeltaNetDecode(_GatedDeltaNetStack):
    """M=1 decode: (input_ids [1,1] int32, position_ids [1,1] int32) -> logits [1,1,V].

    States (buffers mutated in place, each written exactly once per call):
      convState [L, 1, W-1, 2*H*dk + HV*dv]  the last W-1 inputs of the q | k | v short convs
                                            (pre-conv projections), oldest first
      recState  [L, 1, HV, dk, dv]           the delta-rule matrix state, key-major
    """

    def __init__(self, cfg: GatedDeltaNetConfig, src: TensorSource, b: WeightBuilder, state_dtype: torch.dtype):
        super().__init__()
        self.cfg = cfg
        self.emb = b.table("model.embeddings.weight", src["model.embeddings.weight"], "embedding")
        self.layers = nn.ModuleList(_Layer(cfg, i, src, b) for i in range(cfg.num_layers))
        self.norm = b.vector("model.norm.weight", src["model.norm.weight"], "norm")
        self.head = b.matmul("lm_head.weight", src["lm_head.weight"].t(), "head", out_dtype=b.recipe.logits_dtype)
        register_states(self, GATED_DELTANET.state_specs(cfg, state_dtype))

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        del position_ids  # positionless; kept in the signature for engine parity
        x = self.run_layers(input_ids.view(1), None)  # [1, C]
        return self.logits(x).view(1, 1, self.cfg.vocab_size)


class GatedDeltaNetPrefill(_GatedDeltaNetStack):
    """Chunked prefill, T tokens per call, sharing every weight with the decode module.

    (input_ids [1,T] int32, position_ids [1,T] int32, valid_len [1] int32) -> logits [1,1,V]
    of token valid_len-1. Same states as GatedDeltaNetDecode, each written once. Projections,
    the short convs, norms, gates and the MLP run on [T, ·] rows, and the delta rule in its
    chunkwise form (`delta_rule_chunk`): matmuls over the chunk, no per-token loop.
    """

    def __init__(self, decode: GatedDeltaNetDecode, chunk: int):
        super().__init__()
        self.cfg, self.chunk = decode.cfg, chunk
        # The decode module's own submodules and parameters: the same tensors, so the
        # two-function asset stores each weight once.
        self.emb, self.layers, self.norm, self.head = decode.emb, decode.layers, decode.norm, decode.head
        register_states(self, GATED_DELTANET.state_specs(decode.cfg, decode.recState.dtype))

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, valid_len: torch.Tensor) -> torch.Tensor:
        del position_ids
        x = self.run_layers(input_ids.view(self.chunk), valid_len)  # [T, C]
        # Only the last real token's logits: the head is the largest matmul of a small model.
        return self.logits(last_valid(x, valid_len)).view(1, 1, self.cfg.vocab_size)


# --------------------------------------------------------------------------------------
# The architecture object
# --------------------------------------------------------------------------------------


@dataclass
class _GatedDeltaNet(Architecture):
    def config_from_json(self, data: Mapping[str, Any]) -> GatedDeltaNetConfig:
        return GatedDeltaNetConfig(**data)

    def matches_pth(self, source: TensorSource) -> bool:
        return "model.layers.0.attn.A_log" in source and "model.layers.0.attn.q_conv1d.weight" in source

    def load_pth(self, source: TensorSource):
        raise CheckpointError(
            f"{source.origin}: Gated DeltaNet weights load from an fla Hugging Face folder (config.json + "
            "safetensors), not a bare .pth"
        )

    def load_hf(self, config_json: Mapping[str, Any], source: TensorSource):
        cfg = _config_from_fla(config_json, source)
        cfg.validate()
        shapes = canonical_shapes(cfg)
        # Tied models may or may not carry lm_head.weight; when present it is the head.
        tied = bool(config_json.get("tie_word_embeddings", False)) and "lm_head.weight" not in source
        expected = {n: s for n, s in shapes.items() if not (tied and n == "lm_head.weight")}
        # fla from 2024-12-20 to 2025-03-12 saved a per-head `attn.D` it never used (fla #226).
        unused = {f"{_layer(i)}attn.D": (cfg.num_v_heads,) for i in range(cfg.num_layers)}
        check_strict(source, expected | unused, frozenset(unused), what=f"Gated DeltaNet {_describe(cfg)} (fla layout)")
        mapping = {n: (n, _to_f32) for n in shapes}
        if tied:
            mapping["lm_head.weight"] = ("model.embeddings.weight", _to_f32)
        return cfg, MappedSource(source, mapping, shapes)

    def synthetic_weights(self, config: GatedDeltaNetConfig, seed: int) -> TensorSource:
        return GeneratedSource(canonical_shapes(config), seed, _synthetic_init)

    def state_specs(self, config: GatedDeltaNetConfig, state_dtype: torch.dtype) -> list[StateSpec]:
        c = config
        return [
            StateSpec(CONV_STATE, (c.num_layers, 1, c.conv_size - 1, c.conv_dim), state_dtype,
                      "[layer, batch, conv tap (oldest first), channel (q | k | v pre-conv projections)]"),
            StateSpec(REC_STATE, (c.num_layers, 1, c.num_v_heads, c.head_dim, c.head_v_dim), state_dtype,
                      "[layer, batch, value head, key, value]"),
        ]  # fmt: skip

    def build_decode(self, config, weights, builder, state_dtype) -> GatedDeltaNetDecode:
        return GatedDeltaNetDecode(config, weights, builder, state_dtype)

    def build_prefill(self, config, decode: GatedDeltaNetDecode, chunk: int) -> GatedDeltaNetPrefill:
        return GatedDeltaNetPrefill(decode, chunk)

    def reference(self, config, weights) -> GatedDeltaNetReference:
        return GatedDeltaNetReference(config, weights)

    def keeps_float(self, name: str) -> bool:
        return _role(name) in KEEP_FLOAT_ROLES


def _to_f32(t: torch.Tensor) -> torch.Tensor:
    return t.float()


def _describe(cfg: GatedDeltaNetConfig) -> str:
    return (f"(L={cfg.num_layers} C={cfg.hidden_size} H={cfg.num_heads}x{cfg.head_dim} "
            f"HV={cfg.num_v_heads}x{cfg.head_v_dim} V={cfg.vocab_size})")  # fmt: skip


GATED_DELTANET = _GatedDeltaNet(
    name="gated_deltanet",
    description="Gated DeltaNet (fla GatedDeltaNetForCausalLM): gated delta-rule state, short convs, SwiGLU",
    hf_architectures=("GatedDeltaNetForCausalLM", "GatedDeltaNetModel"),
    presets=PRESETS,
    tiny_preset="gated-deltanet-tiny",
)
