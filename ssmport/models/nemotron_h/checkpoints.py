"""Nemotron-H weights: canonical names are the released ones without "backbone." (transformers
loads `backbone.*` or `model.*`), nn.Linear [out, in], the Mamba-2 conv squeezed to [C, K].
The head is never tied (transformers ties nothing): lm_head.weight is required.

An MoE layer (`mixer.`): the router `gate.weight` [E, C] and `gate.e_score_correction_bias`
[E], per expert `experts.N.{up,down}_proj.weight` (canonical: one tensor per expert, as
released), the shared expert `shared_experts.{up,down}_proj.weight`. transformers' fused
in-memory stacks (`experts.up_proj` [E, F, C], `experts.down_proj` [E, C, F]) load too, per layer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ssmport.loader.checkpoint import TensorSource
from ssmport.models.layers.attention import AttentionNames, attention_names, attention_shapes
from ssmport.models.loading import AS_IS, DEPTHWISE_CONV, check_layer_count, storage_view
from ssmport.models.mamba2.checkpoints import mixer_shapes
from ssmport.models.moe import MoeNames, fused_expert_storage, moe_shapes
from ssmport.models.nemotron_h.config import ATTENTION, MAMBA, MOE, NemotronHConfig, from_transformers

EMBEDDING, HEAD, FINAL_NORM = "embeddings.weight", "lm_head.weight", "norm_f.weight"
PREFIXES = ("backbone.", "model.")  # as released; as some conversions save it


def layer(i: int) -> str:
    return f"layers.{i}."


def attention(i: int) -> AttentionNames:
    return attention_names(layer(i) + "mixer.")


def moe_names(i: int) -> MoeNames:
    m = layer(i) + "mixer."
    return MoeNames(m + "gate.weight", (None, m + "experts.{e}.up_proj.weight", m + "experts.{e}.down_proj.weight"),
                    bias=m + "gate.e_score_correction_bias",
                    shared=(None, m + "shared_experts.up_proj.weight", m + "shared_experts.down_proj.weight"))  # fmt: skip


def canonical_shapes(cfg: NemotronHConfig) -> dict[str, tuple[int, ...]]:
    H, V, F = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {EMBEDDING: (V, H)}
    for i, kind in enumerate(cfg.layer_types):
        p, m = layer(i), layer(i) + "mixer."
        shapes[p + "norm.weight"] = (H,)
        if kind == MAMBA:
            shapes |= mixer_shapes(cfg.mixer, m, H)
        elif kind == ATTENTION:
            shapes |= attention_shapes(cfg.attention, attention(i), H)
        elif kind == MOE:
            shapes |= moe_shapes(cfg.moe, moe_names(i), H)
        else:
            shapes |= {m + "up_proj.weight": (F, H), m + "down_proj.weight": (H, F)}
    return shapes | {FINAL_NORM: (H,), HEAD: (V, H)}


def load(cj: Mapping[str, Any], source: TensorSource) -> tuple[NemotronHConfig, TensorSource]:
    """A `NemotronHForCausalLM` folder (`backbone.*` as released, or `model.*`)."""
    cfg = from_transformers(cj, source.origin)
    cfg.validate()
    prefix = next((p for p in PREFIXES if p + EMBEDDING in source), PREFIXES[0])
    check_layer_count(cfg.num_layers, source, prefix + "layers.", source.origin)
    canonical = canonical_shapes(cfg)
    storage = {n: (n if n == HEAD else prefix + n, DEPTHWISE_CONV if n.endswith("conv1d.weight") else AS_IS) for n in canonical}
    for i in (i for i, kind in enumerate(cfg.layer_types) if kind == MOE):
        storage |= fused_expert_storage(cfg.moe, moe_names(i), prefix + layer(i) + "mixer.experts.", source, fused="up_proj")
    return cfg, storage_view(source, canonical, storage, f"Nemotron-H {cfg.describe()}")
