"""LFM2 / LFM2.5 (Liquid AI): gated short convs and GQA attention. The architecture object.

`lfm2_moe` is its own package (ssmport.models.lfm2_moe); `lfm2_vl` is not claimed: a folder
or Hub repo of it is refused by the registry in one line, before any weights are downloaded."""

from __future__ import annotations

from ssmport.models.hybrid import HybridArchitecture
from ssmport.models.lfm2 import block, checkpoints, quant, synthetic
from ssmport.models.lfm2.config import PRESETS, Lfm2Config
from ssmport.models.lfm2.reference import Lfm2Reference
from ssmport.models.package import package_parts

LFM2 = HybridArchitecture(
    name="lfm2",
    description="LFM2 / LFM2.5 (Liquid AI): gated short convs + GQA attention with a KV cache",
    hf_architectures=("Lfm2ForCausalLM",),
    presets=PRESETS,
    tiny_preset="lfm2-tiny",
    preset_keys=("vocab_size", "hidden_size", "intermediate_size", "layer_types", "num_heads", "num_kv_heads", "head_dim"),
    loader=checkpoints.load,
    **package_parts(Lfm2Config, Lfm2Reference, checkpoints, synthetic, block, quant),
)
