"""RWKV-7 "Goose" (x070): config, states, reference step, decode module, checkpoints.

The time-mix recurrence per head, with S the [K, V] matrix state (fla's layout; BlinkDL's
reference code keeps its transpose [V, K]):

    S' = diag(w) S - (kk * a) (kk^T S) + k v^T          o = r^T S'

where w = exp(-exp(-0.5) * sigmoid(w0 + lora_w(x))) is the per-key decay, kk the
L2-normalised (k * k_k) "removal key", and a = sigmoid(a0 + lora_a(x)) the in-context
learning rate. Around it: token shift with six learned mixes, value residual from layer 0,
the `r_k` bonus, GroupNorm `ln_x`, the sigmoid-LoRA output gate, and a relu^2 channel mix.

Sources: BlinkDL's `RWKV_x070` (the `rwkv` package) and `rwkv_v7_numpy.py` for the math;
fla's `RWKV7Attention` / `convert_from_rwkv7.py` for the Hugging Face layout.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ssmport.architectures.base import Architecture, HubSource, Preset
from ssmport.checkpoint import GeneratedSource, MappedSource, TensorSource, check_strict
from ssmport.errors import CheckpointError
from ssmport.prefill import last_valid, scan
from ssmport.quant.plan import WeightBuilder
from ssmport.state import StateSpec, read_layer, register_states, stack_rows, write_once

DECAY_SCALE = math.exp(-0.5)  # w = exp(-DECAY_SCALE * sigmoid(.)) keeps each decay in (0.545, 1)
BLINKDL_LN_X_EPS = 64e-5  # BlinkDL's GroupNorm eps (= 1e-5 * head_size_divisor**2, divisor 8)
MIX_NAMES = ("r", "w", "k", "v", "a", "g")  # the six token-shift mixes x_r .. x_g

WORLD_VOCAB_ROWS = 65536
REC_STATE = "recState"
SHIFT_STATE = "shiftState"


@dataclass(frozen=True)
class RWKV7Config:
    vocab_size: int
    hidden_size: int  # C
    num_layers: int  # L
    head_size: int  # N: key dim per head
    ffn_size: int  # F (4C in released models)
    decay_lora: int  # LoRA ranks, read from w1/a1/v1/g1 when weights are given
    a_lora: int
    v_lora: int
    gate_lora: int
    value_head_size: int | None = None  # per-head value dim; None = head_size (BlinkDL)
    ln_x_eps: float = BLINKDL_LN_X_EPS
    norm_eps: float = 1e-5
    has_ln0: bool = True  # LayerNorm on the embedding before layer 0 (folded at build)

    @property
    def num_heads(self) -> int:
        return self.hidden_size // self.head_size

    @property
    def value_size(self) -> int:
        return self.num_heads * self.v_head

    @property
    def v_head(self) -> int:
        return self.value_head_size or self.head_size

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def validate(self) -> None:
        if self.hidden_size % self.head_size:
            raise CheckpointError(f"hidden size {self.hidden_size} is not a multiple of head size {self.head_size}")


def _lora_dims(c: int) -> dict[str, int]:
    """LoRA ranks of RWKV-LM's x070 trainer for width C (the released World models)."""

    def r(x: float) -> int:
        return max(32, int(round(x / 32) * 32))

    return {
        "decay_lora": r(1.8 * c**0.5),
        "a_lora": r(1.8 * c**0.5),
        "v_lora": r(1.3 * c**0.5),
        "gate_lora": r(0.6 * c**0.8),
    }


def _preset(
    name: str, layers: int, width: int, description: str, released: bool = True, hub: HubSource | None = None, **extra
) -> Preset:
    config = {
        "vocab_size": WORLD_VOCAB_ROWS,
        "hidden_size": width,
        "num_layers": layers,
        "head_size": 64,
        "ffn_size": 4 * width,
        **_lora_dims(width),
        **extra,
    }
    return Preset(name, "rwkv7", config, description, released, hub)


# BlinkDL's releases, one .pth per file (LoRA ranks are read from the file on load; the
# formula above only shapes --synthetic weights). How each name was confirmed is recorded
# with it; `ssmport list` marks the ones that could not be.
_WORLD, _G1 = "BlinkDL/rwkv-7-world", "BlinkDL/rwkv7-g1"
_WORLD_URL = "its resolve/main URL in public READMEs and download scripts"
_G1D = ("hf_hub_download(repo_id='BlinkDL/rwkv7-g1', filename=...) in public code (2026); "
        "candle's rwkv example ships the same files converted")
_G1I = None  # file names seen in public code and on the ModelScope mirror of BlinkDL/rwkv7-g1, not on the Hub itself

PRESETS = (
    _preset("rwkv7-0.1b", 12, 768, "RWKV-7 World 0.1B (L12 C768)",
            hub=HubSource(_WORLD, "RWKV-x070-World-0.1B-v2.8-20241210-ctx4096.pth", confirmed=_WORLD_URL)),
    _preset("rwkv7-0.4b", 24, 1024, "RWKV-7 World 0.4B (L24 C1024)",
            hub=HubSource(_WORLD, "RWKV-x070-World-0.4B-v2.9-20250107-ctx4096.pth", confirmed=_WORLD_URL)),
    _preset("rwkv7-1.5b", 24, 2048, "RWKV-7 World 1.5B (L24 C2048)",
            hub=HubSource(_WORLD, "RWKV-x070-World-1.5B-v3-20250127-ctx4096.pth", confirmed=_WORLD_URL)),
    _preset("rwkv7-2.9b", 32, 2560, "RWKV-7 World 2.9B (L32 C2560)",
            hub=HubSource(_WORLD, "RWKV-x070-World-2.9B-v3-20250211-ctx4096.pth", confirmed=_WORLD_URL)),
    _preset("rwkv7-g1d-0.1b", 12, 768, "RWKV-7 G1d 0.1B (L12 C768, ctx 8192)",
            hub=HubSource(_G1, "rwkv7-g1d-0.1b-20260129-ctx8192.pth", confirmed=_G1D)),
    _preset("rwkv7-g1d-0.4b", 24, 1024, "RWKV-7 G1d 0.4B (L24 C1024, ctx 8192)",
            hub=HubSource(_G1, "rwkv7-g1d-0.4b-20260210-ctx8192.pth", confirmed=_G1D)),
    _preset("rwkv7-g1d-1.5b", 24, 2048, "RWKV-7 G1d 1.5B (L24 C2048, ctx 8192)",
            hub=HubSource(_G1, "rwkv7-g1d-1.5b-20260212-ctx8192.pth", confirmed=_G1D)),
    _preset("rwkv7-g1d-2.9b", 32, 2560, "RWKV-7 G1d 2.9B (L32 C2560, ctx 8192)",
            hub=HubSource(_G1, "rwkv7-g1d-2.9b-20260131-ctx8192.pth", confirmed=_G1D)),
    _preset("rwkv7-g1d-7.2b", 32, 4096, "RWKV-7 G1d 7.2B (L32 C4096, ctx 8192)",
            hub=HubSource(_G1, "rwkv7-g1d-7.2b-20260131-ctx8192.pth", confirmed=_G1D)),
    _preset("rwkv7-g1d-13.3b", 61, 4096, "RWKV-7 G1d 13.3B (L61 C4096, ctx 8192)",
            hub=HubSource(_G1, "rwkv7-g1d-13.3b-20260131-ctx8192.pth", confirmed=_G1D)),
    _preset("rwkv7-g1i-1.5b", 24, 2048, "RWKV-7 G1i 1.5B (L24 C2048, ctx 16384)",
            hub=HubSource(_G1, "rwkv7-g1i-1.5b-20260805-ctx16384.pth", confirmed=_G1I)),
    _preset("rwkv7-g1i-2.9b", 32, 2560, "RWKV-7 G1i 2.9B (L32 C2560, ctx 16384)",
            hub=HubSource(_G1, "rwkv7-g1i-2.9b-20260805-ctx16384.pth", confirmed=_G1I)),
    _preset("rwkv7-g1i-7.2b", 32, 4096, "RWKV-7 G1i 7.2B (L32 C4096, ctx 16384)",
            hub=HubSource(_G1, "rwkv7-g1i-7.2b-20260805-ctx16384.pth", confirmed=_G1I)),
    _preset("rwkv7-g1i-13.3b", 61, 4096, "RWKV-7 G1i 13.3B (L61 C4096, ctx 16384)",
            hub=HubSource(_G1, "rwkv7-g1i-13.3b-20260805-ctx16384.pth", confirmed=_G1I)),
    Preset(
        "rwkv7-tiny",
        "rwkv7",
        {
            "vocab_size": WORLD_VOCAB_ROWS,
            "hidden_size": 128,
            "num_layers": 2,
            "head_size": 32,
            "ffn_size": 512,
            "decay_lora": 32,
            "a_lora": 32,
            "v_lora": 32,
            "gate_lora": 32,
        },
        "embedded default: L2 C128, World vocab, synthetic weights from a fixed seed",
        released=False,
    ),
)


# --------------------------------------------------------------------------------------
# Canonical weights: BlinkDL names, singleton dims squeezed, nn.Linear weights [out, in].
# --------------------------------------------------------------------------------------


def canonical_shapes(cfg: RWKV7Config) -> dict[str, tuple[int, ...]]:
    C, V, F_, H, N = cfg.hidden_size, cfg.vocab_size, cfg.ffn_size, cfg.num_heads, cfg.head_size
    Cv = cfg.value_size
    shapes: dict[str, tuple[int, ...]] = {"emb.weight": (V, C)}
    if cfg.has_ln0:
        shapes |= {"blocks.0.ln0.weight": (C,), "blocks.0.ln0.bias": (C,)}
    for i in range(cfg.num_layers):
        b, a, f = f"blocks.{i}.", f"blocks.{i}.att.", f"blocks.{i}.ffn."
        for ln in ("ln1", "ln2"):
            shapes |= {f"{b}{ln}.weight": (C,), f"{b}{ln}.bias": (C,)}
        shapes |= {f"{a}x_{m}": (C,) for m in MIX_NAMES}
        shapes |= {
            f"{a}w0": (C,), f"{a}w1": (C, cfg.decay_lora), f"{a}w2": (cfg.decay_lora, C),
            f"{a}a0": (C,), f"{a}a1": (C, cfg.a_lora), f"{a}a2": (cfg.a_lora, C),
            f"{a}g1": (C, cfg.gate_lora), f"{a}g2": (cfg.gate_lora, Cv),
            f"{a}k_k": (C,), f"{a}k_a": (C,), f"{a}r_k": (H, N),
            f"{a}receptance.weight": (C, C), f"{a}key.weight": (C, C),
            f"{a}value.weight": (Cv, C), f"{a}output.weight": (C, Cv),
            f"{a}ln_x.weight": (Cv,), f"{a}ln_x.bias": (Cv,),
            f"{f}x_k": (C,), f"{f}key.weight": (F_, C), f"{f}value.weight": (C, F_),
        }  # fmt: skip
        if i > 0:  # layer 0 takes v as v_first; its v-LoRA is unused (and often absent)
            shapes |= {f"{a}v0": (Cv,), f"{a}v1": (C, cfg.v_lora), f"{a}v2": (cfg.v_lora, Cv)}
    shapes |= {"ln_out.weight": (C,), "ln_out.bias": (C,), "head.weight": (V, C)}
    return shapes


def _role(name: str) -> str:
    """Plan category of a canonical weight name."""
    if name in ("emb.weight", "head.weight"):
        return {"emb.weight": "embedding", "head.weight": "head"}[name]
    if name.startswith("ln_out."):
        return "norm"
    _, _, block, leaf, *_ = name.split(".") + [""]
    if block == "ffn" and leaf in ("key", "value"):
        return "ffn"
    if block == "att" and leaf in ("receptance", "key", "value", "output"):
        return "state_proj"
    if block == "att" and re.fullmatch("[wavg][12]", leaf):
        return "lora"
    if block.startswith("ln") or leaf == "ln_x":
        return "norm"
    return "mix"  # x_*, k_k, k_a, r_k, w0/a0/v0


# The r/k/v/o projections and every LoRA factor feed the recurrence: int8 there flips
# borderline tokens, while int8 on the FFN and LM head (the weight bulk) costs nothing
# measurable (the gate of the port this project grew from: 127/127 vs 126/127).
KEEP_FLOAT_ROLES = frozenset({"state_proj", "lora", "norm", "mix", "embedding"})


# --------------------------------------------------------------------------------------
# Checkpoint layouts
# --------------------------------------------------------------------------------------

_UNSQUEEZED_1x1 = ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g", "w0", "a0", "v0", "k_k", "k_a")


def _blinkdl_native_shape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    leaf = name.rsplit(".", 1)[-1]
    return (1, 1, *shape) if leaf in _UNSQUEEZED_1x1 else shape


def _to_f32(t: torch.Tensor) -> torch.Tensor:
    return t.float()


def _squeeze_f32(t: torch.Tensor) -> torch.Tensor:
    return t.float().reshape(-1)


def _t_f32(t: torch.Tensor) -> torch.Tensor:
    return t.float().t()


def _config_from_blinkdl(source: TensorSource) -> RWKV7Config:
    need = ["emb.weight", "blocks.0.att.r_k", "blocks.0.ffn.key.weight", "blocks.0.att.w1",
            "blocks.0.att.a1", "blocks.0.att.g1"]  # fmt: skip
    absent = [n for n in need if n not in source]
    if absent:
        raise CheckpointError(f"{source.origin}: not an RWKV-7 checkpoint (missing {', '.join(absent)})")
    layers = 1 + max(int(n.split(".")[1]) for n in source if n.startswith("blocks."))
    vocab, width = source.shape("emb.weight")
    heads, head_size = source.shape("blocks.0.att.r_k")
    v1 = next((f"blocks.{i}.att.v1" for i in range(1, layers) if f"blocks.{i}.att.v1" in source), None)
    v1 = v1 or ("blocks.0.att.v1" if "blocks.0.att.v1" in source else None)
    return RWKV7Config(
        vocab_size=vocab,
        hidden_size=width,
        num_layers=layers,
        head_size=head_size,
        ffn_size=source.shape("blocks.0.ffn.key.weight")[0],
        decay_lora=source.shape("blocks.0.att.w1")[-1],
        a_lora=source.shape("blocks.0.att.a1")[-1],
        v_lora=source.shape(v1)[-1] if v1 else 32,
        gate_lora=source.shape("blocks.0.att.g1")[-1],
        has_ln0="blocks.0.ln0.weight" in source,
    )


def _mix_row(j: int):
    return lambda t: t.float().reshape(len(MIX_NAMES), -1)[j]


def _fla_names(cfg: RWKV7Config, tied: bool, stacked_mixes: bool) -> dict[str, tuple[str, Any]]:
    """canonical name -> (fla/HF name, transform to canonical layout).

    `stacked_mixes`: fla between 2025-01-20 and 2025-04-09 stored the six token-shift mixes
    as one `attn.x_x` [6, C] (rows r, w, k, v, a, g) instead of `attn.x_r` .. `attn.x_g`.
    """
    m: dict[str, tuple[str, Any]] = {"emb.weight": ("model.embeddings.weight", _to_f32)}
    if cfg.has_ln0:
        m |= {f"blocks.0.ln0.{p}": (f"model.layers.0.pre_norm.{p}", _to_f32) for p in ("weight", "bias")}
    proj = {"receptance": "r_proj", "key": "k_proj", "value": "v_proj", "output": "o_proj"}
    for i in range(cfg.num_layers):
        b, h = f"blocks.{i}.", f"model.layers.{i}."
        for p in ("weight", "bias"):
            m[f"{b}ln1.{p}"] = (f"{h}attn_norm.{p}", _to_f32)
            m[f"{b}ln2.{p}"] = (f"{h}ffn_norm.{p}", _to_f32)
            m[f"{b}att.ln_x.{p}"] = (f"{h}attn.g_norm.{p}", _to_f32)
        for j, mix in enumerate(MIX_NAMES):
            m[f"{b}att.x_{mix}"] = (f"{h}attn.x_x", _mix_row(j)) if stacked_mixes else (f"{h}attn.x_{mix}", _squeeze_f32)
        loras = "wag" + ("v" if i > 0 else "")
        for x in loras:
            m[f"{b}att.{x}1"] = (f"{h}attn.{x}_lora.lora.0.weight", _t_f32)
            m[f"{b}att.{x}2"] = (f"{h}attn.{x}_lora.lora.2.weight", _t_f32)
            if x != "g":  # the gate LoRA has no bias
                m[f"{b}att.{x}0"] = (f"{h}attn.{x}_lora.lora.2.bias", _to_f32)
        m[f"{b}att.k_k"] = (f"{h}attn.k_k", _squeeze_f32)
        m[f"{b}att.k_a"] = (f"{h}attn.k_a", _squeeze_f32)
        m[f"{b}att.r_k"] = (f"{h}attn.r_k", _to_f32)
        for ours, theirs in proj.items():
            m[f"{b}att.{ours}.weight"] = (f"{h}attn.{theirs}.weight", _to_f32)
        m[f"{b}ffn.x_k"] = (f"{h}ffn.x_k", _squeeze_f32)
        m[f"{b}ffn.key.weight"] = (f"{h}ffn.key.weight", _to_f32)
        m[f"{b}ffn.value.weight"] = (f"{h}ffn.value.weight", _to_f32)
    m["ln_out.weight"] = ("model.norm.weight", _to_f32)
    m["ln_out.bias"] = ("model.norm.bias", _to_f32)
    m["head.weight"] = ("model.embeddings.weight" if tied else "lm_head.weight", _to_f32)
    return m


_FLA_VECTORS = ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g", "k_k", "k_a")


def _fla_native_shapes(names: dict[str, tuple[str, Any]], canonical: dict, source: TensorSource) -> dict:
    """The shape each fla tensor must have. Per-channel vectors were saved as [C] or
    [1, 1, C] depending on the fla version; either is accepted, nothing else."""
    native = {}
    for ours, (theirs, _) in names.items():
        shape = canonical[ours]
        leaf = theirs.rsplit(".", 1)[-1]
        if leaf == "x_x":
            shape = (len(MIX_NAMES), *shape)
        elif theirs.endswith((".lora.0.weight", ".lora.2.weight")):
            shape = shape[::-1]
        elif leaf in _FLA_VECTORS and theirs in source and source.shape(theirs) == (1, 1, *shape):
            shape = (1, 1, *shape)
        native[theirs] = shape
    return native


def _config_from_fla(cj: Mapping[str, Any], source: TensorSource) -> RWKV7Config:
    def unsupported(what: str):
        return CheckpointError(f"{source.origin}: RWKV-7 config with {what} is not supported")

    if cj.get("attn") not in (None, {}):
        raise unsupported("hybrid attention layers ('attn')")
    if cj.get("hidden_act", "sqrelu") != "sqrelu":
        raise unsupported(f"hidden_act={cj['hidden_act']!r}")
    if cj.get("norm_bias", True) is not True:
        raise unsupported("norm_bias=false")
    try:
        width = int(cj["hidden_size"])
        layers = int(cj["num_hidden_layers"])
        vocab = int(cj["vocab_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{source.origin}: config.json lacks a valid {exc}") from None
    head_dim = cj.get("head_dim")
    if head_dim is None:
        if not cj.get("num_heads"):
            raise CheckpointError(f"{source.origin}: config.json sets neither head_dim nor num_heads")
        head_dim = width // int(cj["num_heads"])
    value_dim = cj.get("value_dim")
    if isinstance(value_dim, list):
        if len(set(value_dim)) > 1:
            raise unsupported("per-layer value_dim (the stacked recState needs one value size)")
        value_dim = value_dim[0] if value_dim else None
    value_dim = int(value_dim or width)
    heads = width // int(head_dim)
    ffn = cj.get("intermediate_size")
    if ffn is None:  # fla: hidden_size * hidden_ratio, rounded up to a multiple of 32
        ffn = 32 * ((int(width * (cj.get("hidden_ratio") or 4)) + 31) // 32)

    def lora(key: str, weight: str) -> int:
        if cj.get(key) is not None:
            return int(cj[key])
        if weight in source:  # fla derives unset ranks; the weights say what they are
            return source.shape(weight)[0]
        return 32

    norm_eps = float(cj.get("norm_eps", 1e-5))
    return RWKV7Config(
        vocab_size=vocab,
        hidden_size=width,
        num_layers=layers,
        head_size=int(head_dim),
        ffn_size=int(ffn),
        decay_lora=lora("decay_low_rank_dim", "model.layers.0.attn.w_lora.lora.0.weight"),
        a_lora=lora("a_low_rank_dim", "model.layers.0.attn.a_lora.lora.0.weight"),
        v_lora=lora("v_low_rank_dim", "model.layers.1.attn.v_lora.lora.0.weight"),
        gate_lora=lora("gate_low_rank_dim", "model.layers.0.attn.g_lora.lora.0.weight"),
        value_head_size=None if value_dim == width else value_dim // heads,
        ln_x_eps=int(head_dim) * norm_eps,  # fla: GroupNorm eps = head_dim * norm_eps
        norm_eps=norm_eps,
        has_ln0=bool(cj.get("norm_first", True)),
    )


# --------------------------------------------------------------------------------------
# Synthetic weights
# --------------------------------------------------------------------------------------


def _synthetic_init(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Deterministic random canonical weights (see `GeneratedSource`). Scales follow
    RWKV-LM's init ranges closely enough for lively, non-degenerate logits."""
    randn = torch.randn(shape, generator=g)
    leaf = name.rsplit(".", 1)[-1]
    fan_in = shape[-1] if name.endswith(".weight") and len(shape) == 2 else shape[0]
    if name == "emb.weight":
        return randn
    if name.endswith(".weight") and len(shape) == 1:  # norm gains
        return 1.0 + 0.1 * randn
    if name.endswith(".bias"):
        return 0.1 * randn
    if leaf.startswith("x_"):
        return torch.rand(shape, generator=g)
    if leaf == "w0":
        return torch.linspace(-6.0, -0.5, shape[0]) + 0.3 * randn
    if leaf in ("a0", "v0"):
        return 0.5 * randn
    if leaf == "k_k":
        return 0.7 + 0.1 * randn
    if leaf == "k_a":
        return 1.0 + 0.05 * randn
    if leaf == "r_k":
        return -0.04 + 0.2 * randn
    if leaf[:1] in "wavg" and leaf[1:] in ("1", "2"):
        return randn * (0.5 / math.sqrt(shape[0]))
    if name == "head.weight":
        return randn * (2.0 / math.sqrt(fan_in))
    return randn / math.sqrt(fan_in)  # r/k/v/o and FFN projections


# --------------------------------------------------------------------------------------
# The reference step: plain fp32, BlinkDL's state layout S[h][value, key], written for reading.
# --------------------------------------------------------------------------------------


class RWKV7Reference:
    """One token at a time, per head, with nothing fused: the spec for every other form."""

    def __init__(self, cfg: RWKV7Config, weights: TensorSource):
        self.cfg = cfg
        self.w = {name: weights[name].float() for name in canonical_shapes(cfg)}
        self.att = [
            {n.removeprefix(f"blocks.{i}.att."): t for n, t in self.w.items() if n.startswith(f"blocks.{i}.att.")}
            for i in range(cfg.num_layers)
        ]

    def zero_state(self) -> dict[str, list[torch.Tensor]]:
        c = self.cfg
        return {
            "wkv": [torch.zeros(c.num_heads, c.v_head, c.head_size) for _ in range(c.num_layers)],
            "att_x": [torch.zeros(c.hidden_size) for _ in range(c.num_layers)],
            "ffn_x": [torch.zeros(c.hidden_size) for _ in range(c.num_layers)],
        }

    def step(self, token: int, state: dict[str, list[torch.Tensor]]) -> torch.Tensor:
        c, w = self.cfg, self.w
        x = w["emb.weight"][token]
        if c.has_ln0:
            x = F.layer_norm(x, (c.hidden_size,), w["blocks.0.ln0.weight"], w["blocks.0.ln0.bias"], c.norm_eps)
        v_first = None
        for i in range(c.num_layers):
            p = f"blocks.{i}."
            h = F.layer_norm(x, (c.hidden_size,), w[p + "ln1.weight"], w[p + "ln1.bias"], c.norm_eps)
            out, v_first = self._time_mix(i, h, state, v_first)
            x = x + out
            h = F.layer_norm(x, (c.hidden_size,), w[p + "ln2.weight"], w[p + "ln2.bias"], c.norm_eps)
            x = x + self._channel_mix(i, h, state)
        x = F.layer_norm(x, (c.hidden_size,), w["ln_out.weight"], w["ln_out.bias"], c.norm_eps)
        return w["head.weight"] @ x

    def _time_mix(self, i, x, state, v_first):
        c, w = self.cfg, self.att[i]
        H, N, Nv = c.num_heads, c.head_size, c.v_head
        delta = state["att_x"][i] - x
        state["att_x"][i] = x
        xr, xw, xk, xv, xa, xg = (x + delta * w[f"x_{m}"] for m in MIX_NAMES)

        r = w["receptance.weight"] @ xr
        k = w["key.weight"] @ xk
        v = w["value.weight"] @ xv
        decay = torch.exp(-DECAY_SCALE * torch.sigmoid(w["w0"] + torch.tanh(xw @ w["w1"]) @ w["w2"]))
        a = torch.sigmoid(w["a0"] + (xa @ w["a1"]) @ w["a2"])
        g = torch.sigmoid(xg @ w["g1"]) @ w["g2"]
        kk = k * w["k_k"]
        k = k * (1 + (a - 1) * w["k_a"])
        if i == 0:
            v_first = v
        else:
            v = v + (v_first - v) * torch.sigmoid(w["v0"] + (xv @ w["v1"]) @ w["v2"])

        out = torch.empty(H * Nv)
        S = state["wkv"][i]  # [H, Nv, N]
        for h in range(H):
            ks, vs = slice(h * N, (h + 1) * N), slice(h * Nv, (h + 1) * Nv)
            kk_h = kk[ks] / kk[ks].norm().clamp_min(1e-12)
            s = S[h]
            s = s * decay[ks][None, :] - torch.outer(s @ kk_h, kk_h * a[ks]) + torch.outer(v[vs], k[ks])
            S[h] = s
            y = s @ r[ks]
            y = (y - y.mean()) / torch.sqrt(y.var(unbiased=False) + c.ln_x_eps)
            y = y * w["ln_x.weight"][vs] + w["ln_x.bias"][vs]
            out[vs] = y + (r[ks] * k[ks] * w["r_k"][h]).sum() * v[vs]
        return w["output.weight"] @ (out * g), v_first

    def _channel_mix(self, i, x, state):
        p = f"blocks.{i}.ffn."
        delta = state["ffn_x"][i] - x
        state["ffn_x"][i] = x
        k = torch.relu(self.w[p + "key.weight"] @ (x + delta * self.w[p + "x_k"])) ** 2
        return self.w[p + "value.weight"] @ k


# --------------------------------------------------------------------------------------
# The export form: one token, batched per-head matmuls, one write per state.
# --------------------------------------------------------------------------------------


def _layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


class WKVUpdate(NamedTuple):
    """One layer's decode step, applied to its state slice later (`_RWKV7Stack.update_wkv`)."""

    decay: torch.Tensor  # [H, N]
    kka: torch.Tensor  # [H, N]  kk * a
    kk_S: torch.Tensor  # [H, Nv]  kk^T S (the old state)
    k: torch.Tensor  # [H, N]
    v: torch.Tensor  # [H, Nv]


class _Layer(nn.Module):
    def __init__(self, cfg: RWKV7Config, i: int, src: TensorSource, b: WeightBuilder):
        super().__init__()
        self.cfg, self.index = cfg, i
        p, a, f = f"blocks.{i}.", f"blocks.{i}.att.", f"blocks.{i}.ffn."
        vec = lambda n: b.vector(n, src[n], _role(n))  # noqa: E731
        mm = lambda n: b.matmul(n, src[n].t() if n.endswith(".weight") else src[n], _role(n))  # noqa: E731

        self.ln1_w, self.ln1_b = vec(p + "ln1.weight"), vec(p + "ln1.bias")
        self.ln2_w, self.ln2_b = vec(p + "ln2.weight"), vec(p + "ln2.bias")
        # The six mixes as one [6, C] tensor: one broadcast multiply instead of six.
        mix = torch.stack([src[f"{a}x_{m}"] for m in MIX_NAMES])
        self.mix = b.vector(f"{a}x_{{{','.join(MIX_NAMES)}}}", mix, "mix")
        self.r, self.k, self.v, self.o = (mm(a + n + ".weight") for n in ("receptance", "key", "value", "output"))
        self.w0, self.w1, self.w2 = vec(a + "w0"), mm(a + "w1"), mm(a + "w2")
        self.a0, self.a1, self.a2 = vec(a + "a0"), mm(a + "a1"), mm(a + "a2")
        if i > 0:
            self.v0, self.v1, self.v2 = vec(a + "v0"), mm(a + "v1"), mm(a + "v2")
        self.g1, self.g2 = mm(a + "g1"), mm(a + "g2")
        self.k_k, self.k_a, self.r_k = vec(a + "k_k"), vec(a + "k_a"), vec(a + "r_k")
        self.lnx_w, self.lnx_b = vec(a + "ln_x.weight"), vec(a + "ln_x.bias")
        self.ffn_mix = vec(f + "x_k")
        self.ffn_key, self.ffn_value = mm(f + "key.weight"), mm(f + "value.weight")

    def forward(self, x, rec, shift, v_first, valid_len=None):
        """One layer over T tokens.

        x [T,C] fp32; rec [H,N,Nv] (state dtype); shift [2,C]. Decode passes T=1 and
        valid_len None; prefill passes a chunk and valid_len int32 [1] (rows >= valid_len are
        padding: computed, never stored). Returns (x, rec_out, (xa, xf), v_first): rec_out is
        the new state [H,N,Nv] (prefill) or the `WKVUpdate` to apply later (decode); xa and xf
        [1,C] are the new shift rows (time mix, channel mix).
        """
        c = self.cfg
        H, N, Nv = c.num_heads, c.head_size, c.v_head
        T = x.shape[0]

        # --- time mix: every projection batched over the T rows ---
        xa = _layer_norm(x, self.ln1_w, self.ln1_b, c.norm_eps)
        mix = self.mix if T == 1 else self.mix.view(len(MIX_NAMES), 1, -1)
        mixed = xa + (_token_shift(xa, shift[0:1]) - xa) * mix  # [6,C] at T=1 (decode), else [6,T,C]
        xr, xw, xk, xv, xa_, xg = (m.view(T, -1) for m in mixed.split(1, dim=0))
        r = self.r(xr)
        k = self.k(xk)
        v = self.v(xv)
        decay = torch.exp(-DECAY_SCALE * torch.sigmoid(self.w0 + self.w2(torch.tanh(self.w1(xw)))))
        a = torch.sigmoid(self.a0 + self.a2(self.a1(xa_)))
        g = self.g2(torch.sigmoid(self.g1(xg)))
        kk = F.normalize((k * self.k_k).view(T, H, N), dim=-1)
        k = k * (1 + (a - 1) * self.k_a)
        if self.index == 0:
            v_first = v
        else:
            v = v + (v_first - v) * torch.sigmoid(self.v0 + self.v2(self.v1(xv)))

        # The recurrence, in fp32 whatever the state's storage dtype.
        kka = kk * a.view(T, H, N)
        if valid_len is None:
            y, rec_out = _wkv_decode(rec.float(), r.view(H, N), decay.view(H, N), kk.view(H, N), kka.view(H, N),
                                     k.view(H, N), v.view(H, Nv))  # fmt: skip
            y = y.view(1, H, Nv)
        else:  # rows shaped for _wkv_step's broadcasts, so the loop body reshapes nothing
            rows, cols = (T, H, 1, -1), (T, H, -1, 1)
            per_token = (r.view(rows), decay.view(cols), kk.view(rows), kka.view(cols), k.view(cols), v.view(rows))
            S, y = scan(_wkv_step, rec.float().view(1, H, N, Nv), per_token, valid_len, (H, 1, Nv), keep_row_dim=True)
            rec_out, y = S.view(H, N, Nv), y.view(T, H, Nv)

        mean = y.mean(dim=-1, keepdim=True)
        centered = y - mean
        var = (centered * centered).mean(dim=-1, keepdim=True)  # x*x, not x**2: this runtime's pow is slow and not exact
        y = centered * torch.rsqrt(var + c.ln_x_eps)
        y = y.reshape(T, H * Nv) * self.lnx_w + self.lnx_b
        bonus = (r * k * self.r_k.view(1, H * N)).view(T, H, N).sum(dim=-1, keepdim=True)
        y = y + (bonus * v.view(T, H, Nv)).view(T, H * Nv)
        x = x + self.o(y * g)

        # --- channel mix ---
        xf = _layer_norm(x, self.ln2_w, self.ln2_b, c.norm_eps)
        kf = xf + (_token_shift(xf, shift[1:2]) - xf) * self.ffn_mix
        hidden = torch.relu(self.ffn_key(kf))
        x = x + self.ffn_value(hidden * hidden)

        if valid_len is not None:  # the shift state is the last real token's
            xa, xf = last_valid(xa, valid_len), last_valid(xf, valid_len)
        return x, rec_out, (xa, xf), v_first


def _token_shift(rows: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    """Each row's predecessor: [previous; rows[:-1]] for rows [T,C], previous [1,C].

    For T > 1 as a row lookup of rows t-1 (`embedding`, which this runtime runs as a fast
    gather) with row 0 replaced by `previous` through a 0/1 mask, which is exact: the slice +
    concat it replaces cost ~1.2 ms per call at T=64, C=768 (benchmarks/profile_ops.py
    --function prefill). A T x T shift matrix would do too, but is a constant the asset stores."""
    prev = previous.float()
    T = rows.shape[0]
    if T == 1:
        return prev
    earlier = torch.arange(T).clamp(min=1) - 1  # row 0 looks up row 0; the mask drops it
    first = torch.zeros(T, 1, dtype=rows.dtype)
    first[0, 0] = 1
    return F.embedding(earlier, rows) * (1 - first) + first * prev


def _wkv_step(S, r, decay, kk, kka, k, v):
    """One WKV-7 step for all heads (prefill's loop body), shaped to broadcast without reshapes:
    S [1,H,N,Nv] fp32; row vectors r, kk [1,H,1,N] and v [1,H,1,Nv]; column vectors decay,
    kka = kk*a, k [1,H,N,1].

    S' = diag(decay) S - (kk*a) (kk^T S) + k v^T;  y = r^T S'.  Returns (S', y [1,H,1,Nv]).
    """
    S = S * decay - kka * (kk @ S) + k * v
    return S, r @ S



def _wkv_decode(S, r, decay, kk, kka, k, v):
    """Decode's WKV step without forming S' (the stack forms it for all layers at once):

        r^T S' = (r*decay)^T S - (r.(kk*a)) (kk^T S) + (r.k) v^T

    S [H,N,Nv] fp32 (the old state); r, decay, kk, kka = kk*a, k [H,N]; v [H,Nv].
    Returns (y [H,Nv], the WKVUpdate)."""
    H, N, Nv = S.shape
    kk_S = (kk.view(H, 1, N) @ S).view(H, Nv)
    y = (
        ((r * decay).view(H, 1, N) @ S).view(H, Nv)
        - (r * kka).sum(dim=-1, keepdim=True) * kk_S
        + (r * k).sum(dim=-1, keepdim=True) * v
    )
    return y, WKVUpdate(decay, kka, kk_S, k, v)

class _RWKV7Stack(nn.Module):
    """What decode and prefill share: embedding, layers, head, and the state writes.

    Subclasses set emb, layers, ln_out_w, ln_out_b, head and register the two states.
    """

    cfg: RWKV7Config

    def run_layers(self, ids: torch.Tensor, valid_len: torch.Tensor | None) -> torch.Tensor:
        """Embed `ids` [T], run every layer, write both states once; return x [T, C]."""
        x = F.embedding(ids, self.emb).float()  # [T, C]
        rec = []  # new state slices (prefill) or WKVUpdates (decode)
        shift: list[torch.Tensor] = []
        v_first = x  # placeholder; layer 0 replaces it with its v
        for i, layer in enumerate(self.layers):
            x, rec_out, sh, v_first = layer(
                x, read_layer(self.recState, i)[0], read_layer(self.shiftState, i)[0], v_first, valid_len
            )
            rec.append(rec_out)
            shift.extend(sh)  # 2L rows [1,C], stacked once: no per-layer concat (a slow op here)
        if valid_len is None:
            self.update_wkv(rec)
        else:
            write_once(self.recState, rec)
        write_once(self.shiftState, shift)
        return x

    def update_wkv(self, updates: list[WKVUpdate]) -> None:
        """recState <- every layer's S' = diag(decay) S - (kk*a)(kk^T S) + k v^T, as a few
        elementwise ops over the whole [L, H, N, Nv] state and one write.

        Writing the layers' new slices one by one costs a full copy of the state per layer
        on the Linux Core AI runtime (scatter), ~45 ms per token at 1.5B; stacking the small
        per-layer vectors and updating the whole state costs a few passes over it."""
        c = self.cfg
        L, H, N, Nv = c.num_layers, c.num_heads, c.head_size, c.v_head
        decay, kka, kk_S, k, v = (stack_rows(list(f)).view(L, H, *shape)
                                  for f, shape in zip(zip(*updates), ((N, 1), (N, 1), (1, Nv), (N, 1), (1, Nv))))  # fmt: skip
        S = self.recState.float().view(L, H, N, Nv)
        S = S * decay - kka * kk_S + k * v
        self.recState.copy_(S.view(self.recState.shape).to(self.recState.dtype))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head on rows x [R, C] -> [R, V]."""
        return self.head(_layer_norm(x, self.ln_out_w, self.ln_out_b, self.cfg.norm_eps))


class RWKV7Decode(_RWKV7Stack):
    """M=1 decode: (input_ids [1,1] int32, position_ids [1,1] int32) -> logits [1,1,V].

    States (buffers mutated in place, each written exactly once per call):
      recState   [L, 1, H, N, Nv]  the WKV matrix state, key-major (fla layout)
      shiftState [L, 1, 2, C]      token-shift inputs: 0 = time mix (after ln1),
                                   1 = channel mix (after ln2)
    """

    def __init__(self, cfg: RWKV7Config, src: TensorSource, b: WeightBuilder, state_dtype: torch.dtype):
        super().__init__()
        self.cfg = cfg
        emb = src["emb.weight"].float()
        if cfg.has_ln0:  # ln0 is per-row, so folding it into the table is exact
            emb = F.layer_norm(emb, (cfg.hidden_size,), src["blocks.0.ln0.weight"], src["blocks.0.ln0.bias"], cfg.norm_eps)
        self.emb = b.table("emb.weight", emb, "embedding")
        del emb
        self.layers = nn.ModuleList(_Layer(cfg, i, src, b) for i in range(cfg.num_layers))
        self.ln_out_w = b.vector("ln_out.weight", src["ln_out.weight"], "norm")
        self.ln_out_b = b.vector("ln_out.bias", src["ln_out.bias"], "norm")
        self.head = b.matmul("head.weight", src["head.weight"].t(), "head", out_dtype=b.recipe.logits_dtype)
        register_states(self, RWKV7.state_specs(cfg, state_dtype))

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        del position_ids  # positionless; kept in the signature for engine parity
        x = self.run_layers(input_ids.view(1), None)  # [1, C]
        return self.logits(x).view(1, 1, self.cfg.vocab_size)


class RWKV7Prefill(_RWKV7Stack):
    """Chunked prefill, T tokens per call, sharing every weight with the decode module.

    (input_ids [1,T] int32, position_ids [1,T] int32, valid_len [1] int32) -> logits [1,1,V]
    of token valid_len-1 (or [1,T,V] for every row with `all_logits`). Same states as
    RWKV7Decode, each written once. Projections, LoRAs, norms and the FFN run as [T, C]
    matmuls; only the WKV recurrence loops, in-graph, for valid_len steps (`scan`).
    """

    def __init__(self, decode: RWKV7Decode, chunk: int, all_logits: bool = False):
        super().__init__()
        self.cfg, self.chunk, self.all_logits = decode.cfg, chunk, all_logits
        # The decode module's own submodules and parameters: the same tensors, so the
        # two-function asset stores each weight once.
        self.emb, self.layers = decode.emb, decode.layers
        self.ln_out_w, self.ln_out_b, self.head = decode.ln_out_w, decode.ln_out_b, decode.head
        register_states(self, RWKV7.state_specs(decode.cfg, decode.recState.dtype))

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, valid_len: torch.Tensor) -> torch.Tensor:
        del position_ids
        x = self.run_layers(input_ids.view(self.chunk), valid_len)  # [T, C]
        if self.all_logits:
            return self.logits(x).view(1, self.chunk, self.cfg.vocab_size)
        # Only the last real token's logits: the head is the largest matmul of a small model.
        return self.logits(last_valid(x, valid_len)).view(1, 1, self.cfg.vocab_size)


# --------------------------------------------------------------------------------------
# The architecture object
# --------------------------------------------------------------------------------------


@dataclass
class _RWKV7(Architecture):
    def config_from_json(self, data: Mapping[str, Any]) -> RWKV7Config:
        return RWKV7Config(**data)

    def matches_pth(self, source: TensorSource) -> bool:
        return "blocks.0.att.r_k" in source and "blocks.0.att.w1" in source

    def load_pth(self, source: TensorSource) -> tuple[RWKV7Config, TensorSource]:
        cfg = _config_from_blinkdl(source)
        cfg.validate()
        canonical = canonical_shapes(cfg)
        native = {n: _blinkdl_native_shape(n, s) for n, s in canonical.items()}
        # Layer 0's v0/v1/v2 are unused by the math; checkpoints may or may not carry them.
        optional = {f"blocks.0.att.v{j}": s for j, s in ((0, (1, 1, cfg.value_size)),
                                                         (1, (cfg.hidden_size, cfg.v_lora)),
                                                         (2, (cfg.v_lora, cfg.value_size)))}  # fmt: skip
        check_strict(source, native | optional, frozenset(optional), what=f"RWKV-7 {_describe(cfg)}")
        mapping = {n: (n, _squeeze_f32 if len(native[n]) == 3 else _to_f32) for n in canonical}
        return cfg, MappedSource(source, mapping, canonical)

    def load_hf(self, config_json: Mapping[str, Any], source: TensorSource) -> tuple[RWKV7Config, TensorSource]:
        cfg = _config_from_fla(config_json, source)
        cfg.validate()
        # Tied models may or may not carry lm_head.weight; when present it is the head.
        tied = bool(config_json.get("tie_word_embeddings", False)) and "lm_head.weight" not in source
        canonical = canonical_shapes(cfg)
        names = _fla_names(cfg, tied, stacked_mixes="model.layers.0.attn.x_x" in source)
        native = _fla_native_shapes(names, canonical, source)
        check_strict(source, native, what=f"RWKV-7 {_describe(cfg)} (fla layout)")
        return cfg, MappedSource(source, names, canonical)

    def synthetic_weights(self, config: RWKV7Config, seed: int) -> TensorSource:
        return GeneratedSource(canonical_shapes(config), seed, _synthetic_init)

    def state_specs(self, config: RWKV7Config, state_dtype: torch.dtype) -> list[StateSpec]:
        c = config
        return [
            StateSpec(REC_STATE, (c.num_layers, 1, c.num_heads, c.head_size, c.v_head), state_dtype,
                      "[layer, batch, head, key, value]"),
            StateSpec(SHIFT_STATE, (c.num_layers, 1, 2, c.hidden_size), state_dtype,
                      "[layer, batch, (time-mix, channel-mix), hidden]"),
        ]  # fmt: skip

    def build_decode(self, config, weights, builder, state_dtype) -> RWKV7Decode:
        return RWKV7Decode(config, weights, builder, state_dtype)

    def build_prefill(self, config, decode: RWKV7Decode, chunk: int) -> RWKV7Prefill:
        return RWKV7Prefill(decode, chunk)

    def reference(self, config, weights) -> RWKV7Reference:
        return RWKV7Reference(config, weights)

    def keeps_float(self, name: str) -> bool:
        return _role(name) in KEEP_FLOAT_ROLES

    def default_vocab(self, config: RWKV7Config):
        # Every RWKV-7 World model (65,536-row embedding) uses rwkv_vocab_v20230424;
        # BlinkDL's .pth releases ship without it.
        if config.vocab_size == WORLD_VOCAB_ROWS:
            from ssmport.tokenizers import BUNDLED_WORLD_VOCAB

            return BUNDLED_WORLD_VOCAB, "bundled rwkv_vocab_v20230424 (World models)"
        return None



def _describe(cfg: RWKV7Config) -> str:
    return f"(L={cfg.num_layers} C={cfg.hidden_size} H={cfg.num_heads} V={cfg.vocab_size})"


RWKV7 = _RWKV7(
    name="rwkv7",
    description="RWKV-7 Goose (x070): WKV-7 delta-rule state, BlinkDL .pth or fla HF folders",
    hf_architectures=("RWKV7ForCausalLM", "RWKV7Model"),
    presets=PRESETS,
    tiny_preset="rwkv7-tiny",
)
