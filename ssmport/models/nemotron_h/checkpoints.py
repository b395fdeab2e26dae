"""Nemotron-H weights: canonical names are the released ones without "backbone." (transformers
loads `backbone.*` or `model.*`), nn.Linear [out, in], the Mamba-2 conv squeezed to [C, K].
The head is never tied (transformers ties nothing): lm_head.weight is required."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ssmport.checkpoint import TensorSource
from ssmport.models.layers import AttentionNames, attention_names, attention_shapes
from ssmport.models.loading import check_layer_count, checked_view
from ssmport.models.mamba2.checkpoints import mixer_shapes
from ssmport.models.nemotron_h.config import ATTENTION, MAMBA, NemotronHConfig, from_transformers

EMBEDDING, HEAD, FINAL_NORM = "embeddings.weight", "lm_head.weight", "norm_f.weight"
PREFIXES = ("backbone.", "model.")  # as released; as some conversions save it


def layer(i: int) -> str:
    return f"layers.{i}."


def attention(i: int) -> AttentionNames:
    return attention_names(layer(i) + "mixer.")


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
        else:
            shapes |= {m + "up_proj.weight": (F, H), m + "down_proj.weight": (H, F)}
    return shapes | {FINAL_NORM: (H,), HEAD: (V, H)}


def load(cj: Mapping[str, Any], source: TensorSource) -> tuple[NemotronHConfig, TensorSource]:
    """A dense `NemotronHForCausalLM` folder (`backbone.*` as released, or `model.*`)."""
    cfg = from_transformers(cj, source.origin)
    cfg.validate()
    prefix = next((p for p in PREFIXES if p + EMBEDDING in source), PREFIXES[0])
    check_layer_count(cfg.num_layers, source, prefix + "layers.", source.origin)
    canonical = canonical_shapes(cfg)
    renamed = {n: prefix + n for n in canonical if n != HEAD}
    return cfg, checked_view(source, canonical, renamed, "conv1d.weight", f"Nemotron-H {cfg.describe()}")
