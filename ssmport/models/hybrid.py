"""What the hybrid families (LFM2/LFM3, Granite-4.0-H, Nemotron-H, Falcon-H1, Qwen3.5,
OLMo-Hybrid) share beyond their layers (ssmport.models.layers): the stacked states in Apple's
names and shapes, the context a KV cache is sized for, the layer-kind spellings of config.json
and its shared reads, the shared quant roles, and the references' starting states.

States, one stack per kind, rows in layer order among the layers that use it (Apple's
`cache_layer_idx`; docs/hybrids.md, "The stacked states"):

    keyCache, valueCache  [L_attn, 1, kv_heads, context, head_dim]   kind "kv"
    slidingKeyCache, slidingValueCache  [L_sliding, 1, kv_heads, window, head_dim]   kind "ring" (LFM3)
    convStates            [L_conv, 1, K, conv_dim]   the last K conv inputs, time-major, oldest first
    recurrentStates       [L_rec, 1, H, P, N]        Mamba-2's SSM state, transformers' layout

A kind no layer uses is not declared (an all-Mamba Granite has no KV states).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from ssmport.architectures.base import FieldsConfig
from ssmport.loader.checkpoint import TensorSource
from ssmport.errors import CheckpointError, SsmportError
from ssmport.models.layers import CONV_STATES, KEY_CACHE, RECURRENT_STATES, SLIDING_KEY_CACHE, SLIDING_VALUE_CACHE, VALUE_CACHE
from ssmport.models.layers.mamba2_mixer import MixerSpec
from ssmport.models.loading import ConfigReader, dt_limit
from ssmport.models.package import PackagedArchitecture
from ssmport.quant.roles import Role
from ssmport.state import KV, RING, StateSpec

# The positions a KV cache holds unless the export asks for another number (the exporter's
# `context`), bounded by what the model was trained for (`max_position_embeddings`).
DEFAULT_CONTEXT = 4096
MAX_CONTEXT = 1 << 20
# A sliding layer's ring keeps `window` K/V rows whatever --context is (its memory is never
# bounded by the export's options): above this many positions a "window" is a long-context KV
# cache in disguise (the released windows: LFM3 256, RecurrentGemma 2048).
MAX_WINDOW = 1 << 17

# Layer kinds in transformers' names (LFM2's short conv: "conv"); config.json spells some the
# legacy way (transformers' `_LEGACY_LAYER_TYPE_REMAP`: released Granite-4.0-H files say
# "mamba"/"attention").
ATTENTION, MAMBA, CONV, SLIDING = "full_attention", "linear_attention", "conv", "sliding_attention"
LEGACY_LAYER_TYPES = {"mamba": MAMBA, "attention": ATTENTION}


class HybridConfig(FieldsConfig):
    """What the hybrid configs share, mixed into their frozen dataclasses: a kind per layer
    (`layer_types`) and GQA attention heads (Qwen3.5 uses the layer kinds only)."""

    layer_types: tuple[str, ...]
    num_heads: int
    num_kv_heads: int

    def __post_init__(self):  # a JSON list reads back equal (Nemotron-H's layer_types is a property)
        if "layer_types" in self.__dataclass_fields__:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    def layers_of(self, kind: str) -> int:
        return self.layer_types.count(kind)

    def layer_indices(self, kind: str) -> list[int]:
        return [i for i, k in enumerate(self.layer_types) if k == kind]

    @property
    def attention_layers(self) -> int:
        return self.layers_of(ATTENTION)

    @property
    def mamba_layers(self) -> int:
        return self.layers_of(MAMBA)

    def check_layers(self, family: str, kinds: Sequence[str]) -> None:
        """Known kinds only, at least one layer with a state, whole kv groups."""
        unknown = sorted({k for k in self.layer_types if k not in kinds})
        if unknown:
            raise CheckpointError(f"{family}: unknown layer kind(s) {unknown}")
        if not any(k in (ATTENTION, MAMBA, CONV, SLIDING) for k in self.layer_types):
            raise CheckpointError(f"{family}: no layer carries a state (kinds {sorted(set(self.layer_types))})")
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(f"{family}: {self.num_heads} heads do not divide into {self.num_kv_heads} kv heads")


def state_specs(c, dtype: torch.dtype) -> list[StateSpec]:
    """The states of a HybridConfig `c`, in Apple's order: the KV pair of its attention
    layers (`num_kv_heads`, `context`, `head_dim`), the rings of its sliding-window layers
    (`sliding_window` positions), then the conv windows of its LFM2 conv layers
    (`conv_kernel` x `hidden_size`) or of its Mamba-2 layers with their SSM states (`mixer`)."""
    specs = kv_specs(c.attention_layers, c.num_kv_heads, c.context, c.head_dim, dtype) if c.attention_layers else []
    if c.layers_of(SLIDING):
        specs += ring_specs(c.layers_of(SLIDING), c.num_kv_heads, c.sliding_window, c.head_dim, dtype)
    if c.layers_of(CONV):
        specs.append(conv_spec(c.layers_of(CONV), c.conv_kernel, c.hidden_size, dtype, "conv", "B*x"))
    if c.mamba_layers:
        specs += [conv_spec(c.mamba_layers, c.conv_kernel, c.mixer.conv_dim, dtype, "mamba", "x | B | C"),
                  recurrent_spec(c.mamba_layers, c.mixer, dtype)]  # fmt: skip
    return specs


@dataclass
class HybridArchitecture(PackagedArchitecture):
    """A hybrid family's Architecture: its package's parts, its folder loader, `state_specs`."""

    loader: Callable[[Mapping[str, Any], TensorSource], tuple[Any, TensorSource]] | None = None

    def load_hf(self, config_json: Mapping[str, Any], source: TensorSource):
        return self.loader(config_json, source)

    def state_specs(self, config, state_dtype: torch.dtype) -> list[StateSpec]:
        return state_specs(config, state_dtype)

    def apple_state_splits(self, config) -> list:
        return []  # already Apple's states (its KV caches get a dynamic position axis there)

    def with_context(self, config, context: int):
        check_context(context, config.max_position_embeddings)
        return replace(config, context=context)


def max_positions_from(r: ConfigReader) -> int:
    """The positions the model was trained for (config.json max_position_embeddings)."""
    return r.int("max_position_embeddings", MAX_CONTEXT, hi=MAX_CONTEXT * 16)


def check_context(context: Any, max_positions: int) -> None:
    """`--context`: a whole number of positions, within MAX_CONTEXT and what the model was trained for."""
    if isinstance(context, bool) or not isinstance(context, int) or not 1 <= context <= MAX_CONTEXT:
        raise SsmportError(f"--context {context!r}: give a whole number of positions in [1, {MAX_CONTEXT}]")
    if context > max_positions:
        raise SsmportError(f"--context {context} is beyond the model's max_position_embeddings ({max_positions})")


def layer_kinds(values: Any, allowed: Sequence[str], r: ConfigReader, key: str) -> tuple[str, ...]:
    """A config.json list of layer kinds, legacy spellings mapped; any other kind refused."""
    if not isinstance(values, (list, tuple)) or not values or not all(isinstance(v, str) for v in values):
        raise CheckpointError(f"{r.origin}: config.json {key}={values!r} is not a list of layer kinds")
    kinds = tuple(LEGACY_LAYER_TYPES.get(v, v) for v in values)
    unknown = sorted({v for v, k in zip(values, kinds) if k not in allowed})  # as the file spells them
    if unknown:
        raise r.unsupported(f"layer kind(s) {', '.join(map(repr, unknown))} in {key} (supported: {', '.join(allowed)})")
    return kinds


def ring_window(r: ConfigReader, key: str, default: Any) -> int:
    """A sliding window (the ring's slots) from config.json: a whole number in [1, MAX_WINDOW]."""
    window = r.int(key, default, hi=1 << 63)  # the bound below, in its own words
    if window > MAX_WINDOW:
        raise CheckpointError(f"{r.origin}: config.json {key}={window} is above {MAX_WINDOW} positions (a sliding "
                              f"layer keeps a ring of that many K/V rows whatever --context is)")  # fmt: skip
    return window


def rope_theta(r: ConfigReader, default: float) -> float:
    """RoPE's base from `rope_parameters` (transformers 5) or the legacy top-level `rope_theta`;
    a `rope_type` other than "default" (rescaled frequencies) is refused."""
    params = r.raw("rope_parameters", None)
    legacy = r.raw("rope_scaling", None)
    for given in (params, legacy):
        if given is not None and not isinstance(given, Mapping):
            raise CheckpointError(f"{r.origin}: config.json rope_parameters / rope_scaling {given!r} is not an object")
        kind = (given or {}).get("rope_type", (given or {}).get("type", "default"))
        if kind != "default":
            raise r.unsupported(f"rope_type {kind!r} (only the default RoPE)")
    if params and "rope_theta" in params:
        return ConfigReader(params, r.origin, r.family).float("rope_theta", positive=True)
    return r.float("rope_theta", default, positive=True)


def refuse_dt_clamp(r: ConfigReader, key: str, why: str) -> None:
    """Refuse a dt clamp other than [0, inf) (`key` absent or null counts as none)."""
    lo, hi = dt_limit(r, key)
    if lo > 0 or hi is not None:
        raise r.unsupported(f"{key}=[{lo:g}, {hi if hi is not None else 'inf'}] ({why})")


def delta_rule_hybrid_specs(c, dtype: torch.dtype) -> list[StateSpec]:
    """The four states of a Gated DeltaNet + attention hybrid (Qwen3.5, OLMo-Hybrid) in Apple's
    order and names: `c.attention` (an AttentionSpec), `c.delta_rule` (a DeltaRuleSpec) and
    `c.context` size them; rows are the attention layers, then the linear_attention layers."""
    a, d, linear = c.attention, c.delta_rule, c.layers_of(MAMBA)
    kv = (c.attention_layers, 1, a.kv_heads, c.context, a.head_dim)
    kv_axes = "[attention layer, batch, kv head, position, head_dim]"
    return [
        StateSpec(KEY_CACHE, kv, dtype, kv_axes + " (K after k-norm and RoPE)", KV),
        StateSpec(VALUE_CACHE, kv, dtype, kv_axes, KV),
        StateSpec(CONV_STATES, (linear, 1, d.conv_kernel, d.conv_dim), dtype,
                  "[linear layer, batch, conv tap (oldest first), channel (q | k | v pre-conv)]"),
        StateSpec(RECURRENT_STATES, (linear, 1, d.v_heads, d.k_dim, d.v_dim), dtype,
                  "[linear layer, batch, value head, key, value]"),
    ]  # fmt: skip


def common_role(name: str, embed: str, head: str) -> Role | None:
    """The quant roles the attention hybrids name alike: the embedding, the head, the MLP
    (`.mlp.`) and the attention (`.self_attn.`; its q/k norms are norms). None otherwise."""
    if name in (embed, head):
        return Role.EMBEDDING if name == embed else Role.HEAD
    if ".mlp." in name:
        return Role.FFN
    if ".self_attn." in name:
        return Role.NORM if name.endswith(("q_norm.weight", "k_norm.weight")) else Role.ATTN_PROJ
    return None


def delta_rule_hybrid_problems(c) -> dict[str, bool]:
    """What a Gated DeltaNet + attention hybrid config (transformers' key names) must not be, for `refuse`."""
    return {
        f"num_attention_heads={c.num_attention_heads} not a multiple of num_key_value_heads="
        f"{c.num_key_value_heads}": c.num_attention_heads % c.num_key_value_heads != 0,
        f"linear_num_value_heads={c.linear_num_value_heads} not a multiple of linear_num_key_heads="
        f"{c.linear_num_key_heads}": c.linear_num_value_heads % c.linear_num_key_heads != 0,
        f"linear_conv_kernel_dim={c.linear_conv_kernel_dim} (the short conv needs at least 2 taps)":
            c.linear_conv_kernel_dim < 2,
    }  # fmt: skip


def kv_specs(layers: int, kv_heads: int, context: int, head_dim: int, dtype: torch.dtype) -> list[StateSpec]:
    shape, axes = (layers, 1, kv_heads, context, head_dim), "[attention layer, batch, kv head, position, head_dim]"
    return [StateSpec(KEY_CACHE, shape, dtype, axes, KV), StateSpec(VALUE_CACHE, shape, dtype, axes, KV)]


def ring_specs(layers: int, kv_heads: int, window: int, head_dim: int, dtype: torch.dtype) -> list[StateSpec]:
    """The sliding-window layers' K and V rings (kind "ring", ssmport.ops.sliding): `window` slots,
    slot j holding the latest position = j mod window; not sized by --context."""
    shape, axes = (layers, 1, kv_heads, window, head_dim), "[sliding layer, batch, kv head, slot (position mod window), head_dim]"
    return [StateSpec(SLIDING_KEY_CACHE, shape, dtype, axes + " (K after k-norm and RoPE)", RING),
            StateSpec(SLIDING_VALUE_CACHE, shape, dtype, axes, RING)]  # fmt: skip


def conv_spec(layers: int, kernel: int, channels: int, dtype: torch.dtype, kind: str, what: str) -> StateSpec:
    return StateSpec(CONV_STATES, (layers, 1, kernel, channels), dtype,
                     f"[{kind} layer, batch, time: the last K conv inputs, oldest first, channel ({what})]")  # fmt: skip


def recurrent_spec(layers: int, mixer: MixerSpec, dtype: torch.dtype) -> StateSpec:
    return StateSpec(RECURRENT_STATES, (layers, 1, mixer.num_heads, mixer.head_dim, mixer.state_size), dtype,
                     "[mamba layer, batch, head, head_dim, state]")  # fmt: skip


# What stays float under int8keepproj in a Mamba-2 + attention hybrid (benchmarks/hybrid_quant_predicate.py):
# the Mamba in_proj (z, x, B, C, dt enter the recurrence), its per-channel vectors, norms, the embedding.
MAMBA_KEEP_FLOAT_ROLES = frozenset({Role.STATE_PROJ, Role.SSM, Role.NORM, Role.EMBEDDING})


def mamba_attention_role(mlp: str, embedding: str = "model.embed_tokens.weight", head: str = "lm_head.weight"):
    """The plan category of a canonical weight name (fused names like `{...q_proj...,...v_proj...}`
    too) in a hybrid of `.mamba.` and `.self_attn.` mixers whose MLP weights' names hold `mlp`."""

    def role(name: str) -> Role:
        if name in (embedding, head):
            return Role.EMBEDDING if name == embedding else Role.HEAD
        if mlp in name:
            return Role.FFN
        if ".self_attn." in name:
            return Role.ATTN_PROJ
        if ".mamba.in_proj." in name:
            return Role.STATE_PROJ  # z, x, B, C and dt
        if ".mamba.out_proj." in name:
            return Role.OUT_PROJ
        if ".mamba." in name and not name.endswith("norm.weight"):
            return Role.SSM  # conv1d, A_log, dt_bias, D
        return Role.NORM

    return role


# --------------------------------------------------------------------------- references


def reference_zero_state(c: HybridConfig, attention_kind: str, recurrent: Mapping[str, tuple[str, tuple[int, ...]]]) -> dict:
    """A hybrid reference's starting state: position 0; each recurrent state (`name: (layer
    kind, shape)`) zero for every layer of its kind; no K/V rows yet in the attention layers."""
    attns = c.layer_indices(attention_kind)
    zeros = {name: {i: torch.zeros(shape) for i in c.layer_indices(kind)} for name, (kind, shape) in recurrent.items()}
    return {"position": 0, **zeros, "K": {i: [] for i in attns}, "V": {i: [] for i in attns}}


def mamba_attention_zero_state(c: HybridConfig) -> dict:
    """`reference_zero_state` of a Mamba-2 + attention hybrid (Granite-4.0-H, Nemotron-H)."""
    m = c.mixer
    return reference_zero_state(c, ATTENTION, {"conv": (MAMBA, (m.conv_dim, m.conv_kernel)),
                                               "ssm": (MAMBA, (m.num_heads, m.head_dim, m.state_size))})  # fmt: skip


