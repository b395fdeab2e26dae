"""Mamba-2 weights: canonical names (transformers' without "backbone.", conv1d squeezed to
[C, K], nn.Linear [out, in], the head always present) and the transformers / mamba_ssm folders."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ssmport.checkpoint import MappedSource, TensorSource, check_strict
from ssmport.errors import CheckpointError
from ssmport.models.loading import ConfigReader, as_f32, check_layer_count, head_name
from ssmport.models.mamba2.config import Mamba2Config, from_mamba_ssm, from_transformers, is_mamba_ssm


def canonical_shapes(cfg: Mamba2Config) -> dict[str, tuple[int, ...]]:
    D, V, H, I = cfg.hidden_size, cfg.vocab_size, cfg.num_heads, cfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"embeddings.weight": (V, D)}
    for i in range(cfg.num_layers):
        m = f"layers.{i}.mixer."
        shapes |= {f"layers.{i}.norm.weight": (D,), m + "in_proj.weight": (cfg.in_proj_size, D),
                   m + "conv1d.weight": (cfg.conv_dim, cfg.conv_kernel), m + "dt_bias": (H,), m + "A_log": (H,),
                   m + "D": (H,), m + "norm.weight": (I,), m + "out_proj.weight": (D, I)}  # fmt: skip
        if cfg.use_conv_bias:
            shapes[m + "conv1d.bias"] = (cfg.conv_dim,)
        if cfg.use_bias:
            shapes |= {m + "in_proj.bias": (cfg.in_proj_size,), m + "out_proj.bias": (D,)}
    return shapes | {"norm_f.weight": (D,), "lm_head.weight": (V, D)}


def _conv_f32(t):
    return t.float().reshape(t.shape[0], t.shape[-1])  # [C, 1, K] -> [C, K]


def checkpoint_names(cfg: Mamba2Config, embedding: str, head: str) -> dict[str, tuple[str, Any]]:
    """canonical name -> (checkpoint name, transform). Both layouts prefix "backbone."."""
    names = {n: (f"backbone.{n}", _conv_f32 if n.endswith("conv1d.weight") else as_f32) for n in canonical_shapes(cfg)}
    return names | {"embeddings.weight": (embedding, as_f32), "lm_head.weight": (head, as_f32)}


def load(cj: Mapping[str, Any], source: TensorSource) -> tuple[Mamba2Config, TensorSource]:
    """A transformers `Mamba2ForCausalLM` or a mamba_ssm `MambaLMHeadModel` folder."""
    # mamba_ssm and older conversions name the table "embedding"; transformers "embeddings".
    embedding = next((n for n in ("backbone.embeddings.weight", "backbone.embedding.weight") if n in source),
                     "backbone.embeddings.weight")  # fmt: skip
    flags = ConfigReader(cj, source.origin, "Mamba-2")
    if is_mamba_ssm(cj):
        if embedding not in source:
            raise CheckpointError(f"{source.origin}: not a mamba_ssm Mamba-2 checkpoint (no {embedding})")
        cfg, tied, layout = from_mamba_ssm(cj, source.origin, source.shape(embedding)[0]), flags.bool("tie_embeddings", True), "mamba_ssm layout"
    else:
        cfg, tied, layout = from_transformers(cj, source.origin), flags.bool("tie_word_embeddings", False), "transformers layout"
    cfg.validate()
    check_layer_count(cfg.num_layers, source, "backbone.layers.", source.origin)
    canonical = canonical_shapes(cfg)
    names = checkpoint_names(cfg, embedding, head_name(tied, source, "lm_head.weight", embedding))
    # conv1d is stored as a depthwise nn.Conv1d: [C, 1, K]
    native = {theirs: (cfg.conv_dim, 1, cfg.conv_kernel) if ours.endswith("conv1d.weight") else canonical[ours]
              for ours, (theirs, _) in names.items()}  # fmt: skip
    check_strict(source, native, what=f"Mamba-2 {cfg.describe()} ({layout})")
    return cfg, MappedSource(source, names, canonical)
