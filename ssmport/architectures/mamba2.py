"""Mamba-2 (SSD): config, states, reference step, decode module, checkpoints.

One decode step of layer i, with H heads of P channels, N-dim state, G groups of B/C:

    z | xBC | dt = in_proj(rmsnorm(x))              xBC = x | B | C, conv_dim = H*P + 2*G*N
    xBC = silu(depthwise causal conv over the last K inputs xBC)
    dt  = softplus(dt + dt_bias)  (clamped to dt_limit)        A = -exp(A_log)   per head
    S_h = S_h * exp(dt_h * A_h) + dt_h * x_h ⊗ B_g         S_h [P, N], g = h // (H / G)
    y_h = S_h · C_g + D_h * x_h
    out = out_proj(rmsnorm_grouped(y * silu(z)))          gate first, then the norm (G groups)
    x   = x + out

Sources for the math: the Mamba-2 paper (Dao & Gu, 2024), state-spaces/mamba's `Mamba2.step`
and transformers' `Mamba2Mixer` (their single-token `selective_state_update` path). The
checkpoint layouts: transformers' `Mamba2ForCausalLM` (config keys hidden_size, state_size,
n_groups, ...) and mamba_ssm's `MambaLMHeadModel` (d_model, n_layer, ssm_cfg, ...).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ssmport.architectures.base import Architecture, HubSource, Preset
from ssmport.causal_conv import causal_conv
from ssmport.checkpoint import GeneratedSource, MappedSource, TensorSource, check_strict
from ssmport.errors import CheckpointError
from ssmport.prefill import last_valid
from ssmport.quant.plan import WeightBuilder
from ssmport.state import StateSpec, read_layer, register_states, stack_rows, write_once

CONV_STATE = "convState"
SSM_STATE = "ssmState"
NEOX_VOCAB_ROWS = 50288  # GPT-NeoX's 50,277 tokens padded to a multiple of 16 (state-spaces releases)


@dataclass(frozen=True)
class Mamba2Config:
    vocab_size: int  # rows of the embedding (padded vocab)
    hidden_size: int  # D
    num_layers: int  # L
    num_heads: int  # H
    head_dim: int  # P
    state_size: int  # N
    n_groups: int = 1  # G: heads h use B/C group h // (H / G)
    conv_kernel: int = 4  # K
    use_conv_bias: bool = True
    use_bias: bool = False  # biases on in_proj / out_proj
    norm_eps: float = 1e-5  # every RMSNorm, the gated one included
    residual_in_fp32: bool = True
    dt_min: float = 0.0  # dt is clamped to [dt_min, dt_max] after the softplus
    dt_max: float | None = None  # None = no upper bound (the released models)

    @property
    def intermediate_size(self) -> int:  # I = H * P
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.intermediate_size + 2 * self.n_groups * self.state_size

    @property
    def in_proj_size(self) -> int:  # z | xBC | dt
        return self.intermediate_size + self.conv_dim + self.num_heads

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def validate(self) -> None:
        if self.num_heads % self.n_groups:
            raise CheckpointError(f"Mamba-2: {self.num_heads} heads do not divide into {self.n_groups} groups")
        if self.conv_kernel < 2:
            raise CheckpointError(f"Mamba-2: conv kernel {self.conv_kernel} < 2 is not supported")


def _preset(name: str, layers: int, width: int, hf: bool = False) -> Preset:
    config = {
        "vocab_size": NEOX_VOCAB_ROWS,
        "hidden_size": width,
        "num_layers": layers,
        "num_heads": 2 * width // 64,  # expand 2, headdim 64
        "head_dim": 64,
        "state_size": 128,
        "n_groups": 1,
        "conv_kernel": 4,
    }
    size = name.removeprefix("mamba2-")
    if hf:  # the transformers-format copies: safetensors and a tokenizer.json
        hub = HubSource(f"AntonV/mamba2-{size}-hf", confirmed=_COPIES)
        description = f"state-spaces mamba2-{size} in transformers format, with its tokenizer (L{layers} D{width})"
        name = f"{name}-hf"
    else:  # the original releases: mamba_ssm config.json + pytorch_model.bin, no tokenizer
        hub = HubSource(f"state-spaces/mamba2-{size}", confirmed=_ORIGINALS)
        description = f"state-spaces {name} (L{layers} D{width}, d_state 128, headdim 64)"
    return Preset(name, "mamba2", config, description, True, hub)


_ORIGINALS = "repo ids of all five sizes in public code (from_pretrained calls, model registries)"
_COPIES = "repo ids of all five sizes in public code (model registries; AutoTokenizer/AutoModel calls)"
_SIZES = (("mamba2-130m", 24, 768), ("mamba2-370m", 48, 1024), ("mamba2-780m", 48, 1536),
          ("mamba2-1.3b", 48, 2048), ("mamba2-2.7b", 64, 2560))  # fmt: skip

PRESETS = (
    *(_preset(name, layers, width) for name, layers, width in _SIZES),
    *(_preset(name, layers, width, hf=True) for name, layers, width in _SIZES),
    Preset(
        "mamba2-tiny",
        "mamba2",
        {"vocab_size": 512, "hidden_size": 128, "num_layers": 2, "num_heads": 8, "head_dim": 32,
         "state_size": 48, "n_groups": 2, "conv_kernel": 4},
        "test model: L2 D128, H8 P32 N48, 2 groups, synthetic weights from a fixed seed",
        released=False,
    ),  # fmt: skip
)


# --------------------------------------------------------------------------------------
# Canonical weights: transformers' names without "backbone.", conv1d squeezed to [C, K],
# nn.Linear weights [out, in], the head always present (a tied head maps to the embedding).
# --------------------------------------------------------------------------------------


def canonical_shapes(cfg: Mamba2Config) -> dict[str, tuple[int, ...]]:
    D, V, H, I = cfg.hidden_size, cfg.vocab_size, cfg.num_heads, cfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"embeddings.weight": (V, D)}
    for i in range(cfg.num_layers):
        m = f"layers.{i}.mixer."
        shapes |= {
            f"layers.{i}.norm.weight": (D,),
            m + "in_proj.weight": (cfg.in_proj_size, D),
            m + "conv1d.weight": (cfg.conv_dim, cfg.conv_kernel),
            m + "dt_bias": (H,), m + "A_log": (H,), m + "D": (H,),
            m + "norm.weight": (I,),
            m + "out_proj.weight": (D, I),
        }  # fmt: skip
        if cfg.use_conv_bias:
            shapes[m + "conv1d.bias"] = (cfg.conv_dim,)
        if cfg.use_bias:
            shapes |= {m + "in_proj.bias": (cfg.in_proj_size,), m + "out_proj.bias": (D,)}
    shapes |= {"norm_f.weight": (D,), "lm_head.weight": (V, D)}
    return shapes


def _role(name: str) -> str:
    """Plan category of a canonical weight name."""
    if name == "embeddings.weight":
        return "embedding"
    if name == "lm_head.weight":
        return "head"
    leaf = name.split(".mixer.", 1)[1] if ".mixer." in name else name
    if leaf.startswith("in_proj."):
        return "state_proj"  # produces x, B, C, dt (and the gate z)
    if leaf.startswith("out_proj."):
        return "out_proj"
    if leaf.startswith("conv1d.") or leaf in ("dt_bias", "A_log", "D"):
        return "ssm"
    return "norm"


# Which matmuls int8keepproj keeps in fp16, decided by measurement (docs/quantization.md,
# "Mamba-2"; tiny model, 4 streams x 48 teacher-forced steps, torch eager vs fp32):
# - in_proj produces x, B, C and dt, all of which enter the recurrence; dt goes through
#   exp(dt * A), so its error compounds in the state: always fp16.
# - out_proj writes the residual stream that every later layer's recurrence reads. With
#   out_proj int8 the error was several times that of head-only int8 (see the table), for
#   ~1/3 of the layer weights: it stays fp16, as RWKV-7 keeps its output projection.
# - the LM head reads nothing back into the state; int8 there costs the least per byte
#   saved: int8.
KEEP_FLOAT_ROLES = frozenset({"state_proj", "out_proj", "ssm", "norm", "embedding"})


# --------------------------------------------------------------------------------------
# Checkpoint layouts
# --------------------------------------------------------------------------------------


def _to_f32(t: torch.Tensor) -> torch.Tensor:
    return t.float()


def _conv_f32(t: torch.Tensor) -> torch.Tensor:
    return t.float().reshape(t.shape[0], t.shape[-1])  # [C, 1, K] -> [C, K]


def _unsupported(origin: str, what: str) -> CheckpointError:
    return CheckpointError(f"{origin}: Mamba-2 config with {what} is not supported")


def _int(cj: Mapping[str, Any], key: str, origin: str, default: int | None = None) -> int:
    value = cj.get(key, default)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise CheckpointError(f"{origin}: config.json lacks a valid {key!r}") from None


def _json_float(value) -> float:
    """A float from config.json: a number, Python's `Infinity`, or transformers 5's
    `{"__float__": "Infinity"}` (how it writes non-finite floats)."""
    if isinstance(value, Mapping) and set(value) == {"__float__"}:
        value = value["__float__"]
    return float(value)


def _dt_limit(limit, origin: str) -> tuple[float, float | None]:
    """(lo, hi) with hi = None for "no upper bound" (JSON cannot say inf portably)."""
    if limit is None:
        return 0.0, None
    try:
        lo, hi = (_json_float(v) for v in limit)
    except (TypeError, ValueError):
        raise CheckpointError(f"{origin}: time_step_limit / dt_limit {limit!r} is not a pair of numbers") from None
    return lo, (None if math.isinf(hi) else hi)


def _config_from_transformers(cj: Mapping[str, Any], origin: str) -> Mamba2Config:
    """transformers' Mamba2Config; missing keys take its defaults, as transformers would."""
    if cj.get("hidden_act", "silu") != "silu":
        raise _unsupported(origin, f"hidden_act={cj['hidden_act']!r}")
    if cj.get("norm_before_gate", False):
        # transformers ignores this key and always gates first; mamba_ssm honours it. The
        # two disagree on such a checkpoint, so it is refused rather than guessed.
        raise _unsupported(origin, "norm_before_gate=true")
    hidden = _int(cj, "hidden_size", origin, 4096)
    heads, head_dim = _int(cj, "num_heads", origin, 128), _int(cj, "head_dim", origin, 64)
    expand = cj.get("expand", 2)
    if hidden * expand != heads * head_dim:
        raise CheckpointError(
            f"{origin}: hidden_size*expand ({hidden}*{expand}) != num_heads*head_dim ({heads}*{head_dim})"
        )
    lo, hi = _dt_limit(cj.get("time_step_limit"), origin)
    return Mamba2Config(
        vocab_size=_int(cj, "vocab_size", origin, 32768),
        hidden_size=hidden,
        num_layers=_int(cj, "num_hidden_layers", origin, 64),
        num_heads=heads,
        head_dim=head_dim,
        state_size=_int(cj, "state_size", origin, 128),
        n_groups=_int(cj, "n_groups", origin, 8),
        conv_kernel=_int(cj, "conv_kernel", origin, 4),
        use_conv_bias=bool(cj.get("use_conv_bias", True)),
        use_bias=bool(cj.get("use_bias", False)),
        norm_eps=float(cj.get("layer_norm_epsilon", 1e-5)),
        residual_in_fp32=bool(cj.get("residual_in_fp32", True)),
        dt_min=lo,
        dt_max=hi,
    )


def _is_mamba_ssm_config(cj: Mapping[str, Any]) -> bool:
    ssm = cj.get("ssm_cfg")
    return "d_model" in cj and isinstance(ssm, Mapping) and ssm.get("layer") == "Mamba2"


def _config_from_mamba_ssm(cj: Mapping[str, Any], source: TensorSource) -> Mamba2Config:
    """mamba_ssm's MambaConfig (state-spaces/mamba2-*): Mamba2 defaults fill ssm_cfg."""
    origin = source.origin
    ssm = cj["ssm_cfg"]
    checks = {
        "d_intermediate (an MLP after each mixer)": cj.get("d_intermediate", 0) not in (0, None),
        "attention layers (attn_layer_idx)": bool(cj.get("attn_layer_idx")),
        "rms_norm=false (LayerNorm blocks)": cj.get("rms_norm", True) is not True,
        "ssm_cfg.rmsnorm=false": ssm.get("rmsnorm", True) is not True,
        "ssm_cfg.norm_before_gate=true": bool(ssm.get("norm_before_gate", False)),
        "ssm_cfg.D_has_hdim=true": bool(ssm.get("D_has_hdim", False)),
        "ssm_cfg.d_ssm (a partial SSM)": ssm.get("d_ssm") is not None,
    }
    for what, bad in checks.items():
        if bad:
            raise _unsupported(origin, what)
    width = _int(cj, "d_model", origin)
    head_dim = _int(ssm, "headdim", origin, 64)
    inner = int(ssm.get("expand", 2) * width)
    if inner % head_dim:
        raise CheckpointError(f"{origin}: d_inner {inner} is not a multiple of headdim {head_dim}")
    embedding = "backbone.embedding.weight"
    if embedding not in source:
        raise CheckpointError(f"{origin}: not a mamba_ssm Mamba-2 checkpoint (no {embedding})")
    lo, hi = _dt_limit(ssm.get("dt_limit"), origin)
    return Mamba2Config(
        vocab_size=source.shape(embedding)[0],  # vocab_size padded to pad_vocab_size_multiple
        hidden_size=width,
        num_layers=_int(cj, "n_layer", origin),
        num_heads=inner // head_dim,
        head_dim=head_dim,
        state_size=_int(ssm, "d_state", origin, 128),
        n_groups=_int(ssm, "ngroups", origin, 1),
        conv_kernel=_int(ssm, "d_conv", origin, 4),
        use_conv_bias=bool(ssm.get("conv_bias", True)),
        use_bias=bool(ssm.get("bias", False)),
        norm_eps=float(cj.get("norm_epsilon", 1e-5)),
        residual_in_fp32=bool(cj.get("residual_in_fp32", True)),
        dt_min=lo,
        dt_max=hi,
    )


def _checkpoint_names(cfg: Mamba2Config, embedding: str, head: str) -> dict[str, tuple[str, Any]]:
    """canonical name -> (checkpoint name, transform). Both layouts prefix "backbone."."""
    m: dict[str, tuple[str, Any]] = {}
    for name in canonical_shapes(cfg):
        if name == "embeddings.weight":
            m[name] = (embedding, _to_f32)
        elif name == "lm_head.weight":
            m[name] = (head, _to_f32)
        else:
            m[name] = (f"backbone.{name}", _conv_f32 if name.endswith("conv1d.weight") else _to_f32)
    return m


# --------------------------------------------------------------------------------------
# Synthetic weights
# --------------------------------------------------------------------------------------


def _synthetic_init(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Deterministic random canonical weights (see `GeneratedSource`). Scales follow
    mamba_ssm's init: A = 1..16, dt = softplus^-1 of log-uniform [1e-3, 1e-1], D = 1."""
    rand = torch.rand(shape, generator=g)
    randn = torch.randn(shape, generator=g)
    leaf = name.split(".mixer.", 1)[1] if ".mixer." in name else name
    if name == "embeddings.weight":
        return randn
    if leaf == "A_log":
        return torch.log(1 + 15 * rand)
    if leaf == "dt_bias":
        dt = torch.exp(rand * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        return dt + torch.log(-torch.expm1(-dt))  # inverse softplus
    if leaf == "D":
        return 1.0 + 0.1 * randn
    if leaf == "conv1d.weight":
        return randn / math.sqrt(shape[-1])
    if leaf.endswith(".bias") or leaf == "conv1d.bias":
        return 0.1 * randn
    if len(shape) == 1:  # norm gains
        return 1.0 + 0.1 * randn
    if name == "lm_head.weight":
        return randn * (2.0 / math.sqrt(shape[1]))
    return randn / math.sqrt(shape[1])  # in_proj / out_proj


# --------------------------------------------------------------------------------------
# The reference step: plain fp32, one head at a time, written for reading.
# --------------------------------------------------------------------------------------


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * weight


class Mamba2Reference:
    """One token at a time, per head, nothing fused: the spec for every other form.

    State per layer: conv [conv_dim, K], the last K conv inputs (oldest first), and
    ssm [H, P, N].
    """

    def __init__(self, cfg: Mamba2Config, weights: TensorSource):
        self.cfg = cfg
        self.w = {name: weights[name].float() for name in canonical_shapes(cfg)}

    def zero_state(self) -> dict[str, list[torch.Tensor]]:
        c = self.cfg
        return {
            "conv": [torch.zeros(c.conv_dim, c.conv_kernel) for _ in range(c.num_layers)],
            "ssm": [torch.zeros(c.num_heads, c.head_dim, c.state_size) for _ in range(c.num_layers)],
        }

    def step(self, token: int, state: dict[str, list[torch.Tensor]]) -> torch.Tensor:
        c, w = self.cfg, self.w
        x = w["embeddings.weight"][token]
        for i in range(c.num_layers):
            x = x + self._mixer(i, _rms_norm(x, w[f"layers.{i}.norm.weight"], c.norm_eps), state)
        x = _rms_norm(x, w["norm_f.weight"], c.norm_eps)
        return w["lm_head.weight"] @ x

    def _mixer(self, i: int, h: torch.Tensor, state) -> torch.Tensor:
        c, p = self.cfg, f"layers.{i}.mixer."
        w = {k.removeprefix(p): v for k, v in self.w.items() if k.startswith(p)}
        I, GN, H, P = c.intermediate_size, c.n_groups * c.state_size, c.num_heads, c.head_dim
        zxbcdt = w["in_proj.weight"] @ h + (w["in_proj.bias"] if c.use_bias else 0)
        z, xBC, dt = zxbcdt.split([I, c.conv_dim, H])

        window = torch.cat([state["conv"][i][:, 1:], xBC[:, None]], dim=1)  # [conv_dim, K]
        state["conv"][i] = window
        xBC = (window * w["conv1d.weight"]).sum(-1) + (w["conv1d.bias"] if c.use_conv_bias else 0)
        xs, B, C = F.silu(xBC).split([I, GN, GN])

        y = torch.empty(I)
        S = state["ssm"][i]
        for head in range(H):
            g = head // (H // c.n_groups)
            dt_h = F.softplus(dt[head] + w["dt_bias"][head]).clamp(c.dt_min, c.dt_max)
            A_h = -torch.exp(w["A_log"][head])
            x_h = xs[head * P : (head + 1) * P]
            B_g = B[g * c.state_size : (g + 1) * c.state_size]
            C_g = C[g * c.state_size : (g + 1) * c.state_size]
            S[head] = S[head] * torch.exp(dt_h * A_h) + dt_h * torch.outer(x_h, B_g)
            y[head * P : (head + 1) * P] = S[head] @ C_g + w["D"][head] * x_h

        y = y * F.silu(z)  # gate first, then the grouped norm
        groups = y.view(c.n_groups, -1)
        y = (groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + c.norm_eps)).reshape(I) * w["norm.weight"]
        return w["out_proj.weight"] @ y + (w["out_proj.bias"] if c.use_bias else 0)


# --------------------------------------------------------------------------------------
# The export form: one token, all heads at once, one write per state.
# --------------------------------------------------------------------------------------


class _Mixer(nn.Module):
    def __init__(self, cfg: Mamba2Config, i: int, src: TensorSource, b: WeightBuilder):
        super().__init__()
        self.cfg = cfg
        p = f"layers.{i}."
        m = p + "mixer."
        vec = lambda n: b.vector(n, src[n], _role(n))  # noqa: E731
        mm = lambda n: b.matmul(n, src[n].t(), _role(n))  # noqa: E731
        self.norm_w = vec(p + "norm.weight")
        self.in_proj = mm(m + "in_proj.weight")
        self.in_bias = vec(m + "in_proj.bias") if cfg.use_bias else None
        self.conv_w = vec(m + "conv1d.weight")
        self.conv_b = vec(m + "conv1d.bias") if cfg.use_conv_bias else None
        self.dt_bias = vec(m + "dt_bias")
        # Stored as A = -exp(A_log): the same fp32 op the graph would run every step.
        self.A = b.vector(m + "A_log", -torch.exp(src[m + "A_log"].float()), "ssm")
        self.D = vec(m + "D")
        self.gnorm_w = vec(m + "norm.weight")
        self.out_proj = mm(m + "out_proj.weight")
        self.out_bias = vec(m + "out_proj.bias") if cfg.use_bias else None

    def forward(self, x, conv, ssm, valid_len=None):
        """One mixer over T tokens.

        x [T,D] fp32; conv [conv_dim,K], ssm [H,P,N] (state dtype). Decode passes T=1 and
        valid_len None; prefill passes a chunk and valid_len int32 [1] (rows >= valid_len are
        padding: computed, never stored). Returns (out [T,D], new conv, new ssm): the new ssm
        is the state [H,P,N] (prefill) or the `SSMUpdate` to apply later (decode).
        """
        c = self.cfg
        I, H, P, N, G = c.intermediate_size, c.num_heads, c.head_dim, c.state_size, c.n_groups
        T = x.shape[0]
        zxbcdt = self.in_proj(_rms_norm(x, self.norm_w, c.norm_eps))
        if self.in_bias is not None:
            zxbcdt = zxbcdt + self.in_bias
        z, xBC, dt = zxbcdt.split([I, c.conv_dim, H], dim=-1)

        xBC, new_conv = causal_conv(conv.float().t(), xBC, self.conv_w.view(c.conv_dim, c.conv_kernel).t(), valid_len)
        new_conv = new_conv.t()  # convState keeps [conv_dim, K]: the K inputs, not K-1
        if self.conv_b is not None:
            xBC = xBC + self.conv_b
        xBC = F.silu(xBC)
        xs, BC = xBC[:, :I].reshape(T, H, P), xBC[:, I:].reshape(T, 2, G, N)  # BC: B then C, per group

        dt = F.softplus(dt + self.dt_bias)  # [T, H]
        if c.dt_min > 0 or c.dt_max is not None:
            dt = dt.clamp(c.dt_min, c.dt_max)

        # The recurrence, in fp32 whatever the state's storage dtype.
        log_decay, dtx = dt * self.A, dt.view(T, H, 1) * xs  # [T, H], [T, H, P]
        if valid_len is None:
            y, S = _ssm_decode(ssm.float(), torch.exp(log_decay).view(H), dtx.view(H, P), BC.view(2, G, N))
            y = y.view(1, H, P)
        else:
            S, y = _ssd_chunk(ssm.float(), log_decay, dtx, BC, valid_len)
        y = y + self.D.view(H, 1) * xs

        y = y.view(T, I) * F.silu(z)  # gate first, then the grouped norm
        groups = y.view(T, G, I // G)
        y = (groups * torch.rsqrt((groups * groups).mean(-1, keepdim=True) + c.norm_eps)).view(T, I) * self.gnorm_w
        out = self.out_proj(y)
        if self.out_bias is not None:
            out = out + self.out_bias
        return out, new_conv, S


def _ssd_chunk(S0, log_decay, dtx, BC, valid_len):
    """The SSM over a chunk of T tokens in Mamba-2's chunkwise (SSD) form: matmuls, no loop.

    S0 [H,P,N] fp32; log_decay = dt*A [T,H]; dtx = dt*x [T,H,P]; BC [T,2,G,N]. With
    cum[t] = sum of log_decay up to t (per head) and D[t,s] = exp(cum[t] - cum[s]) for s <= t:

        y[t]  = exp(cum[t]) * (S0 . C[t])  +  sum_{s<=t} D[t,s] (C[t].B[s]) dtx[s]
        S_T   = exp(cum[T-1]) * S0          +  sum_s D[T-1,s] dtx[s] (x) B[s]

    which unrolls S_t = S_{t-1} exp(log_decay[t]) + dtx[t] (x) B[t]; y[t] = S_t . C[t] exactly
    up to rounding. Rows t >= valid_len are padding: their log_decay and dtx are zeroed, so they
    neither decay nor feed the state. The step loop this replaces (an in-graph while_loop over
    [H,P,N] per token) made a 130m prefill cost ~40 ms per token. Returns (S_T, y [T,H,P]).
    """
    H, P, N = S0.shape
    T, G = BC.shape[0], BC.shape[2]
    real = (torch.arange(T) < valid_len).to(S0.dtype)  # [T]
    log_decay = log_decay * real.view(T, 1)
    dtx = dtx * real.view(T, 1, 1)
    up_to = torch.tril(torch.ones(T, T, dtype=S0.dtype))  # up_to[t, s] = s <= t
    cum = (up_to @ log_decay).t()  # [H, T]: inclusive prefix sums as a matmul
    gap = cum.view(H, T, 1) - cum.view(H, 1, T)  # [H, T, T]: cum[t] - cum[s]
    D = torch.exp(gap * up_to) * up_to  # zero above the diagonal (exp(0) there: never inf * 0)
    per_head = lambda v: v.view(G, 1, *v.shape[1:]).expand(G, H // G, *v.shape[1:]).reshape(H, *v.shape[1:])  # noqa: E731
    B = per_head(BC[:, 0].permute(1, 0, 2))  # [H, T, N]
    C = per_head(BC[:, 1].permute(1, 0, 2))  # [H, T, N]
    xh = dtx.permute(1, 0, 2)  # [H, T, P]
    y = ((C @ B.transpose(1, 2)) * D) @ xh + torch.exp(cum).view(H, T, 1) * (C @ S0.transpose(1, 2))
    to_end = D[:, T - 1 : T, :].transpose(1, 2)  # [H, T, 1]: exp(cum[T-1] - cum[s])
    S = torch.exp(cum[:, T - 1]).view(H, 1, 1) * S0 + (xh * to_end).transpose(1, 2) @ B
    return S, y.permute(1, 0, 2).contiguous()


class SSMUpdate(NamedTuple):
    """One layer's decode step, applied to its state slice later (`_Mamba2Stack.update_ssm`)."""

    decay: torch.Tensor  # [H]    exp(dt*A)
    dtx: torch.Tensor  # [H, P]   dt*x
    B: torch.Tensor  # [G, N]


def _ssm_decode(S, decay, dtx, BC):
    """Decode's SSM step without forming S' (the stack forms it for all layers at once):

        S'·C = decay * (S·C) + dtx * (B·C)

    S [H,P,N] fp32 (the old state); decay = exp(dt*A) [H]; dtx = dt*x [H,P]; BC [2,G,N] (B, C
    per group; heads h of group g = h // (H/G) share them).
    Returns (y [H,P], the SSMUpdate)."""
    H, P, N = S.shape
    G = BC.shape[1]
    B, C = BC[0], BC[1]
    SC = (S.view(G, H // G, P, N) @ C.view(G, 1, N, 1)).view(G, H // G, P)
    BdotC = (B * C).sum(-1).view(G, 1, 1)
    y = decay.view(G, H // G, 1) * SC + dtx.view(G, H // G, P) * BdotC
    return y.view(H, P), SSMUpdate(decay, dtx, B)


class _Mamba2Stack(nn.Module):
    """What decode and prefill share: embedding, layers, head, and the state writes.

    Subclasses set emb, layers, norm_f, head, residual_dtype and register the two states.
    """

    cfg: Mamba2Config

    def run_layers(self, ids: torch.Tensor, valid_len: torch.Tensor | None) -> torch.Tensor:
        """Embed `ids` [T], run every layer, write both states once; return x [T, D]."""
        x = F.embedding(ids, self.emb).float()  # [T, D]
        conv: list[torch.Tensor] = []
        ssm: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            out, window, S = layer(x, read_layer(self.convState, i)[0], read_layer(self.ssmState, i)[0], valid_len)
            x = x + out
            if self.residual_dtype != torch.float32:
                x = x.to(self.residual_dtype).float()
            conv.append(window)
            ssm.append(S)
        write_once(self.convState, conv)
        if valid_len is None:
            self.update_ssm(ssm)
        else:
            write_once(self.ssmState, ssm)
        return x

    def update_ssm(self, updates: list[SSMUpdate]) -> None:
        """ssmState <- every layer's S' = S*decay + dtx ⊗ B, as two elementwise ops over the
        whole [L, H, P, N] state and one write.

        Writing the layers' new slices one by one copies the whole state per layer on the
        Linux Core AI runtime (24 scatters of 18.9 MB at 130m: 27 of 105 ms per token, runtime
        Profiler); the stacked small vectors and one whole-state update cost a few passes."""
        c = self.cfg
        L, H, P, N, G = c.num_layers, c.num_heads, c.head_dim, c.state_size, c.n_groups
        decay, dtx, B = (stack_rows(list(f)) for f in zip(*updates))
        S = self.ssmState.float().view(L, G, H // G, P, N)
        S = S * decay.view(L, G, H // G, 1, 1) + dtx.view(L, G, H // G, P, 1) * B.view(L, G, 1, 1, N)
        self.ssmState.copy_(S.view(self.ssmState.shape).to(self.ssmState.dtype))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head on rows x [R, D] -> [R, V]."""
        return self.head(_rms_norm(x, self.norm_f, self.cfg.norm_eps))


class Mamba2Decode(_Mamba2Stack):
    """M=1 decode: (input_ids [1,1] int32, position_ids [1,1] int32) -> logits [1,1,V].

    States (buffers mutated in place, each written exactly once per call):
      convState [L, 1, conv_dim, K]  the last K conv inputs xBC, oldest first (K, not K-1:
                                     the layout of transformers' and mamba_ssm's conv cache)
      ssmState  [L, 1, H, P, N]      the SSM state per head, head_dim x state_size
    """

    def __init__(self, cfg: Mamba2Config, src: TensorSource, b: WeightBuilder, state_dtype: torch.dtype):
        super().__init__()
        self.cfg = cfg
        self.emb = b.table("embeddings.weight", src["embeddings.weight"], "embedding")
        self.layers = nn.ModuleList(_Mixer(cfg, i, src, b) for i in range(cfg.num_layers))
        self.norm_f = b.vector("norm_f.weight", src["norm_f.weight"], "norm")
        self.head = b.matmul("lm_head.weight", src["lm_head.weight"].t(), "head", out_dtype=b.recipe.logits_dtype)
        # residual_in_fp32=False: the checkpoint's own runtime carries the residual in its
        # weight dtype, so it is rounded to the recipe's float dtype after each block.
        self.residual_dtype = torch.float32 if cfg.residual_in_fp32 else b.recipe.float_dtype
        register_states(self, MAMBA2.state_specs(cfg, state_dtype))

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        del position_ids  # positionless; kept in the signature for engine parity
        x = self.run_layers(input_ids.view(1), None)  # [1, D]
        return self.logits(x).view(1, 1, self.cfg.vocab_size)


class Mamba2Prefill(_Mamba2Stack):
    """Chunked prefill, T tokens per call, sharing every weight with the decode module.

    (input_ids [1,T] int32, position_ids [1,T] int32, valid_len [1] int32) -> logits [1,1,V]
    of token valid_len-1. Same states as Mamba2Decode, each written once. in_proj, the conv,
    the gate, the norms and out_proj run on [T, ...] rows, and the SSM in its chunkwise form
    (`_ssd_chunk`): matmuls over the chunk, no per-token loop.
    """

    def __init__(self, decode: Mamba2Decode, chunk: int):
        super().__init__()
        self.cfg, self.chunk = decode.cfg, chunk
        # The decode module's own submodules and parameters: the same tensors, so the
        # two-function asset stores each weight once.
        self.emb, self.layers, self.norm_f, self.head = decode.emb, decode.layers, decode.norm_f, decode.head
        self.residual_dtype = decode.residual_dtype
        register_states(self, MAMBA2.state_specs(decode.cfg, decode.ssmState.dtype))

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, valid_len: torch.Tensor) -> torch.Tensor:
        del position_ids
        x = self.run_layers(input_ids.view(self.chunk), valid_len)  # [T, D]
        # Only the last real token's logits: the head is the largest matmul of a small model.
        return self.logits(last_valid(x, valid_len)).view(1, 1, self.cfg.vocab_size)


# --------------------------------------------------------------------------------------
# The architecture object
# --------------------------------------------------------------------------------------


@dataclass
class _Mamba2(Architecture):
    def config_from_json(self, data: Mapping[str, Any]) -> Mamba2Config:
        return Mamba2Config(**data)

    def matches_hf_config(self, config_json: Mapping[str, Any]) -> bool:
        return super().matches_hf_config(config_json) or _is_mamba_ssm_config(config_json)

    def matches_pth(self, source: TensorSource) -> bool:
        return False  # Mamba-2 ships as folders with a config.json (n_groups is not in the shapes)

    def load_pth(self, source: TensorSource):
        raise CheckpointError(f"{source.origin}: Mamba-2 checkpoints are loaded from their folder (with config.json)")

    def load_hf(self, config_json: Mapping[str, Any], source: TensorSource) -> tuple[Mamba2Config, TensorSource]:
        if _is_mamba_ssm_config(config_json):
            cfg = _config_from_mamba_ssm(config_json, source)
            tied = bool(config_json.get("tie_embeddings", True))
            layout = "mamba_ssm layout"
        else:
            cfg = _config_from_transformers(config_json, source.origin)
            tied = bool(config_json.get("tie_word_embeddings", False))
            layout = "transformers layout"
        cfg.validate()
        # mamba_ssm and older conversions name the table "embedding"; transformers "embeddings".
        embedding = next((n for n in ("backbone.embeddings.weight", "backbone.embedding.weight") if n in source),
                         "backbone.embeddings.weight")  # fmt: skip
        # A tied head is usually absent from the file; when present it is the head.
        head = embedding if tied and "lm_head.weight" not in source else "lm_head.weight"
        names = _checkpoint_names(cfg, embedding, head)
        canonical = canonical_shapes(cfg)
        native = {theirs: canonical[ours] for ours, (theirs, _) in names.items()}
        for ours, (theirs, _) in names.items():
            if ours.endswith("conv1d.weight"):  # stored as a depthwise nn.Conv1d: [C, 1, K]
                native[theirs] = (cfg.conv_dim, 1, cfg.conv_kernel)
        check_strict(source, native, what=f"Mamba-2 {_describe(cfg)} ({layout})")
        return cfg, MappedSource(source, names, canonical)

    def synthetic_weights(self, config: Mamba2Config, seed: int) -> TensorSource:
        return GeneratedSource(canonical_shapes(config), seed, _synthetic_init)

    def state_specs(self, config: Mamba2Config, state_dtype: torch.dtype) -> list[StateSpec]:
        c = config
        return [
            StateSpec(CONV_STATE, (c.num_layers, 1, c.conv_dim, c.conv_kernel), state_dtype,
                      "[layer, batch, channel (x|B|C), time: last K conv inputs, oldest first]"),
            StateSpec(SSM_STATE, (c.num_layers, 1, c.num_heads, c.head_dim, c.state_size), state_dtype,
                      "[layer, batch, head, head_dim, state]"),
        ]  # fmt: skip

    def build_decode(self, config, weights, builder, state_dtype) -> Mamba2Decode:
        return Mamba2Decode(config, weights, builder, state_dtype)

    def build_prefill(self, config, decode: Mamba2Decode, chunk: int) -> Mamba2Prefill:
        return Mamba2Prefill(decode, chunk)

    def reference(self, config, weights) -> Mamba2Reference:
        return Mamba2Reference(config, weights)

    def keeps_float(self, name: str) -> bool:
        return _role(name) in KEEP_FLOAT_ROLES


def _describe(cfg: Mamba2Config) -> str:
    return (f"(L={cfg.num_layers} D={cfg.hidden_size} H={cfg.num_heads} P={cfg.head_dim} "
            f"N={cfg.state_size} G={cfg.n_groups} V={cfg.vocab_size})")  # fmt: skip


MAMBA2 = _Mamba2(
    name="mamba2",
    description="Mamba-2 (SSD): conv + SSM states, transformers or mamba_ssm folders",
    hf_architectures=("Mamba2ForCausalLM", "Mamba2Model"),
    presets=PRESETS,
    tiny_preset="mamba2-tiny",
)
