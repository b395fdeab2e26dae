"""Falcon-H1 (TII, `falcon_h1`): attention and Mamba-2 side by side in every layer, the SwiGLU
MLP, µP multipliers. The architecture object."""

from __future__ import annotations

from ssmport.models.falcon_h1 import block, checkpoints, quant, synthetic
from ssmport.models.falcon_h1.config import PRESETS, FalconH1Config
from ssmport.models.falcon_h1.reference import FalconH1Reference
from ssmport.models.hybrid import HybridArchitecture
from ssmport.models.package import package_parts

FALCON_H1 = HybridArchitecture(
    name="falcon_h1",
    description="Falcon-H1 (TII): attention + Mamba-2 in parallel in every layer, the SwiGLU MLP, µP multipliers",
    hf_architectures=("FalconH1ForCausalLM",),
    presets=PRESETS,
    tiny_preset="falcon-h1-tiny",
    preset_keys=("vocab_size", "hidden_size", "num_hidden_layers", "num_heads", "num_kv_heads", "head_dim",
                 "intermediate_size", "mamba_heads", "mamba_head_dim", "state_size", "n_groups"),
    loader=checkpoints.load,
    **package_parts(FalconH1Config, FalconH1Reference, checkpoints, synthetic, block, quant),
)
