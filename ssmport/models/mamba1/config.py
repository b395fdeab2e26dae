"""Mamba-1 and Falcon-Mamba config (transformers' MambaConfig / FalconMambaConfig and mamba_ssm's
MambaConfig), presets.

Read but without effect at inference: the init fields (time_step_scale/min/max/floor/init_scheme,
initializer_range, rescale_prenorm_residual) and the training-path switches (use_mambapy,
use_associative_scan, mamba_ssm's fused_add_norm): they pick how a kernel computes the same scan."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ssmport.architectures.base import FieldsConfig, HubSource, Preset
from ssmport.errors import CheckpointError
from ssmport.models.loading import ConfigReader

FAMILY = "Mamba-1"


@dataclass(frozen=True)
class Mamba1Config(FieldsConfig):
    vocab_size: int  # rows of the embedding (padded vocab)
    hidden_size: int  # D
    num_layers: int  # L
    intermediate_size: int  # I = expand * D: the scan's channels
    dt_rank: int  # R: x_proj's low-rank dt, expanded by dt_proj to I
    state_size: int = 16  # N
    conv_kernel: int = 4  # K
    use_conv_bias: bool = True
    use_bias: bool = False  # biases on in_proj / out_proj
    norm_eps: float = 1e-5  # the block and final RMSNorms
    residual_in_fp32: bool = True
    bcdt_norm_eps: float | None = None  # Falcon-Mamba: weightless RMSNorms on dt, B, C (None: Mamba)

    def validate(self) -> None:
        if self.conv_kernel < 2:
            raise CheckpointError(f"{FAMILY}: conv kernel {self.conv_kernel} < 2 is not supported")

    def describe(self) -> str:
        norms = ", dt/B/C norms" if self.bcdt_norm_eps is not None else ""
        return f"L{self.num_layers} D{self.hidden_size} I{self.intermediate_size} N{self.state_size} R{self.dt_rank}{norms}"


def auto_dt_rank(hidden: int) -> int:
    return math.ceil(hidden / 16)  # "auto" in transformers and mamba_ssm


def _dt_rank(r: ConfigReader, key: str, hidden: int) -> int:
    return auto_dt_rank(hidden) if r.raw(key, "auto") == "auto" else r.int(key)


def from_transformers(cj: Mapping[str, Any], origin: str) -> Mamba1Config:
    """transformers' MambaConfig or FalconMambaConfig; missing keys take its defaults."""
    r = ConfigReader(cj, origin, FAMILY)
    r.refuse({f"hidden_act={cj.get('hidden_act')!r}": cj.get("hidden_act", "silu") != "silu"})
    hidden = r.int("hidden_size", 768)
    inner = r.size("hidden_size*expand", int(r.float("expand", 2, positive=True) * hidden))  # int(): as transformers
    if r.raw("intermediate_size", inner) != inner:  # transformers recomputes it from expand
        raise CheckpointError(f"{origin}: config.json intermediate_size={cj['intermediate_size']!r} is not "
                              f"expand x hidden_size = {inner}")  # fmt: skip
    falcon = cj.get("model_type") == "falcon_mamba"
    return Mamba1Config(
        vocab_size=r.int("vocab_size", 50280), hidden_size=hidden, num_layers=r.layers("num_hidden_layers", 32),
        intermediate_size=inner, dt_rank=_dt_rank(r, "time_step_rank", hidden), state_size=r.int("state_size", 16),
        conv_kernel=r.int("conv_kernel", 4), use_conv_bias=r.bool("use_conv_bias", True),
        use_bias=r.bool("use_bias", False), norm_eps=r.float("layer_norm_epsilon", 1e-5, positive=True),
        residual_in_fp32=r.bool("residual_in_fp32", True),
        bcdt_norm_eps=r.float("mixer_rms_eps", 1e-6, positive=True) if falcon else None,
    )  # fmt: skip


def is_mamba_ssm(cj: Mapping[str, Any]) -> bool:
    """A mamba_ssm MambaConfig (no model_type) whose layers are Mamba-1: ssm_cfg absent, {} or
    layer "Mamba1" (Mamba-2's say "Mamba2": ssmport.models.mamba2.config.is_mamba_ssm)."""
    ssm = cj.get("ssm_cfg") or {}
    return "d_model" in cj and "model_type" not in cj and isinstance(ssm, Mapping) and ssm.get("layer", "Mamba1") == "Mamba1"


def from_mamba_ssm(cj: Mapping[str, Any], origin: str, vocab_rows: int) -> Mamba1Config:
    """mamba_ssm's MambaConfig (state-spaces/mamba-*): Mamba defaults fill ssm_cfg; the vocab is
    the embedding's rows (vocab_size padded to pad_vocab_size_multiple)."""
    s = cj.get("ssm_cfg") or {}
    r, ssm = ConfigReader(cj, origin, FAMILY), ConfigReader(s, origin, FAMILY)
    r.refuse({"d_intermediate (an MLP after each mixer)": cj.get("d_intermediate", 0) not in (0, None),
              "attention layers (attn_layer_idx)": bool(cj.get("attn_layer_idx")),
              "rms_norm=false (LayerNorm blocks)": cj.get("rms_norm", True) is not True})  # fmt: skip
    width = r.int("d_model")
    return Mamba1Config(
        vocab_size=vocab_rows, hidden_size=width, num_layers=r.layers("n_layer"),
        intermediate_size=ssm.size("d_model*expand", ssm.float("expand", 2, positive=True) * width),
        dt_rank=_dt_rank(ssm, "dt_rank", width), state_size=ssm.int("d_state", 16), conv_kernel=ssm.int("d_conv", 4),
        use_conv_bias=ssm.bool("conv_bias", True), use_bias=ssm.bool("bias", False),
        norm_eps=r.float("norm_epsilon", 1e-5, positive=True), residual_in_fp32=r.bool("residual_in_fp32", True),
    )  # fmt: skip


NEOX_VOCAB_ROWS = 50280  # GPT-NeoX's 50,277 tokens padded to a multiple of 8 (state-spaces releases)
_CONFIRMED = "repo ids of all five sizes in public code (transformers' Mamba docs and tests, model registries)"
_SIZES = (("130m", 24, 768), ("370m", 48, 1024), ("790m", 48, 1536), ("1.4b", 48, 2048), ("2.8b", 64, 2560))


def _mamba(size: str, layers: int, width: int, hf: bool) -> Preset:
    config = {"vocab_size": NEOX_VOCAB_ROWS, "hidden_size": width, "num_layers": layers, "intermediate_size": 2 * width,
              "dt_rank": auto_dt_rank(width)}  # fmt: skip
    if hf:  # the transformers-format copies: safetensors and a tokenizer.json
        return Preset(f"mamba-{size}-hf", "mamba1", config,
                      f"state-spaces mamba-{size} in transformers format, with its tokenizer (L{layers} D{width}, d_state 16)",
                      True, HubSource(f"state-spaces/mamba-{size}-hf", confirmed=_CONFIRMED))  # fmt: skip
    # the original releases: mamba_ssm config.json + pytorch_model.bin, no tokenizer
    return Preset(f"mamba-{size}", "mamba1", config, f"state-spaces mamba-{size} (L{layers} D{width}, d_state 16)", True,
                  HubSource(f"state-spaces/mamba-{size}", confirmed=_CONFIRMED))  # fmt: skip


PRESETS = (
    *(_mamba(*size, hf=False) for size in _SIZES),
    *(_mamba(*size, hf=True) for size in _SIZES),
    Preset("falcon-mamba-7b", "mamba1",
           {"vocab_size": 65024, "hidden_size": 4096, "num_layers": 64, "intermediate_size": 8192, "dt_rank": 256,
            "bcdt_norm_eps": 1e-6},
           "TII Falcon-Mamba 7B (L64 D4096, d_state 16, RMS norms on dt/B/C), untied head", True,
           HubSource("tiiuae/falcon-mamba-7b", confirmed="repo id from its model card; every value above in three "
                     "third-party copies of its config.json (no mixer_rms_eps there: transformers' default 1e-6)")),
    Preset("mamba1-tiny", "mamba1",
           {"vocab_size": 512, "hidden_size": 96, "num_layers": 2, "intermediate_size": 192, "dt_rank": 8,
            "state_size": 12, "conv_kernel": 4},
           "test model: L2 D96 I192 N12 R8, synthetic weights from a fixed seed", released=False),
    Preset("falcon-mamba-tiny", "mamba1",
           {"vocab_size": 512, "hidden_size": 96, "num_layers": 2, "intermediate_size": 192, "dt_rank": 8,
            "state_size": 12, "conv_kernel": 3, "bcdt_norm_eps": 1e-6},
           "test model: Falcon-Mamba L2 D96 I192 N12 R8 K3, synthetic weights from a fixed seed", released=False),
)  # fmt: skip
