"""LFM3 (Liquid AI): gated short convs, sliding-window attention over a ring state, and full
attention with a KV cache; sandwich norms and a per-head attention gate. The architecture object."""

from __future__ import annotations

from ssmport.models.hybrid import HybridArchitecture
from ssmport.models.lfm3 import block, checkpoints, quant, synthetic
from ssmport.models.lfm3.config import PRESETS, Lfm3Config
from ssmport.models.lfm3.reference import Lfm3Reference
from ssmport.models.package import package_parts

LFM3 = HybridArchitecture(
    name="lfm3",
    description="LFM3 (Liquid AI): gated short convs + sliding-window attention (a ring state) + full attention",
    hf_architectures=("Lfm3ForCausalLM",),
    presets=PRESETS,
    tiny_preset="lfm3-tiny",
    preset_keys=("vocab_size", "hidden_size", "intermediate_size", "layer_types", "num_heads", "num_kv_heads", "head_dim",
                 "sliding_window", "conv_kernel", "sandwich_norm", "attention_gate"),
    loader=checkpoints.load,
    **package_parts(Lfm3Config, Lfm3Reference, checkpoints, synthetic, block, quant),
)
