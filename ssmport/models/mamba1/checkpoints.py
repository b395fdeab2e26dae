"""Mamba-1 / Falcon-Mamba weights: canonical names (transformers' without "backbone.", conv1d
squeezed to [I, K], nn.Linear [out, in], the head always present) and the transformers /
mamba_ssm folders. Falcon-Mamba's dt/B/C norms are weightless: nothing to load."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ssmport.loader.checkpoint import TensorSource
from ssmport.models.loading import load_mamba_folder
import ssmport.models.mamba1.config as config
from ssmport.models.mamba1.config import FAMILY, Mamba1Config


def canonical_shapes(cfg: Mamba1Config) -> dict[str, tuple[int, ...]]:
    D, V, I, N, R = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size, cfg.state_size, cfg.dt_rank
    shapes: dict[str, tuple[int, ...]] = {"embeddings.weight": (V, D)}
    for i in range(cfg.num_layers):
        m = f"layers.{i}.mixer."
        shapes |= {f"layers.{i}.norm.weight": (D,), m + "in_proj.weight": (2 * I, D),
                   m + "conv1d.weight": (I, cfg.conv_kernel), m + "x_proj.weight": (R + 2 * N, I),
                   m + "dt_proj.weight": (I, R), m + "dt_proj.bias": (I,), m + "A_log": (I, N), m + "D": (I,),
                   m + "out_proj.weight": (D, I)}  # fmt: skip
        if cfg.use_conv_bias:
            shapes[m + "conv1d.bias"] = (I,)
        if cfg.use_bias:
            shapes |= {m + "in_proj.bias": (2 * I,), m + "out_proj.bias": (D,)}
    return shapes | {"norm_f.weight": (D,), "lm_head.weight": (V, D)}


def load(cj: Mapping[str, Any], source: TensorSource) -> tuple[Mamba1Config, TensorSource]:
    """A transformers `MambaForCausalLM` / `FalconMambaForCausalLM` or a mamba_ssm `MambaLMHeadModel` folder."""
    family = "Falcon-Mamba" if cj.get("model_type") == "falcon_mamba" else FAMILY
    return load_mamba_folder(cj, source, family, config, canonical_shapes, tied_by_default=True)  # both configs tie by default
