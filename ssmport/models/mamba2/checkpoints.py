"""Mamba-2 weights: canonical names (transformers' without "backbone.", conv1d squeezed to
[C, K], nn.Linear [out, in], the head always present) and the transformers / mamba_ssm folders."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ssmport.loader.checkpoint import TensorSource
from ssmport.models.loading import load_mamba_folder
import ssmport.models.mamba2.config as config
from ssmport.models.layers.mamba2_mixer import MixerSpec
from ssmport.models.mamba2.config import Mamba2Config


def mixer_shapes(spec: MixerSpec, prefix: str, hidden: int) -> dict[str, tuple[int, ...]]:
    """One Mamba-2 mixer's canonical tensors (names after `prefix`, conv1d squeezed to [C, K])."""
    H, I, m = spec.num_heads, spec.intermediate_size, prefix
    shapes = {m + "in_proj.weight": (spec.in_proj_size, hidden), m + "conv1d.weight": (spec.conv_dim, spec.conv_kernel),
              m + "dt_bias": (H,), m + "A_log": (H,), m + "D": (H,), m + "out_proj.weight": (hidden, I)}  # fmt: skip
    if spec.gated_norm != "none":
        shapes[m + "norm.weight"] = (I,)
    if spec.conv_bias:
        shapes[m + "conv1d.bias"] = (spec.conv_dim,)
    if spec.proj_bias:
        shapes |= {m + "in_proj.bias": (spec.in_proj_size,), m + "out_proj.bias": (hidden,)}
    return shapes


def canonical_shapes(cfg: Mamba2Config) -> dict[str, tuple[int, ...]]:
    D, V = cfg.hidden_size, cfg.vocab_size
    shapes: dict[str, tuple[int, ...]] = {"embeddings.weight": (V, D)}
    for i in range(cfg.num_layers):
        shapes |= {f"layers.{i}.norm.weight": (D,)} | mixer_shapes(cfg.mixer, f"layers.{i}.mixer.", D)
    return shapes | {"norm_f.weight": (D,), "lm_head.weight": (V, D)}


def checkpoint_names(cfg: Mamba2Config, embedding: str, head: str) -> dict[str, str]:
    """canonical name -> checkpoint name. Both layouts prefix "backbone."."""
    names = {n: f"backbone.{n}" for n in canonical_shapes(cfg)}
    return names | {"embeddings.weight": embedding, "lm_head.weight": head}


def load(cj: Mapping[str, Any], source: TensorSource) -> tuple[Mamba2Config, TensorSource]:
    """A transformers `Mamba2ForCausalLM` or a mamba_ssm `MambaLMHeadModel` folder."""
    return load_mamba_folder(cj, source, "Mamba-2", config, canonical_shapes, tied_by_default=False)
