"""Mamba-2 config (transformers' Mamba2Config and mamba_ssm's MambaConfig), presets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ssmport.architectures.base import FieldsConfig
from ssmport.architectures.base import HubSource, Preset
from ssmport.errors import CheckpointError
from ssmport.models.layers.mamba2_mixer import MixerSpec
from ssmport.models.loading import ConfigReader, dt_limit

NEOX_VOCAB_ROWS = 50288  # GPT-NeoX's 50,277 tokens padded to a multiple of 16 (state-spaces releases)


@dataclass(frozen=True)
class Mamba2Config(FieldsConfig):
    vocab_size: int  # rows of the embedding (padded vocab)
    hidden_size: int  # D
    num_layers: int  # L
    num_heads: int  # H
    head_dim: int  # P
    state_size: int  # N
    n_groups: int = 1  # G: heads h use B/C group h // (H / G)
    conv_kernel: int = 4  # K
    use_conv_bias: bool = True
    use_bias: bool = False  # biases on in_proj / out_proj
    norm_eps: float = 1e-5  # every RMSNorm, the gated one included
    residual_in_fp32: bool = True
    dt_min: float = 0.0  # dt is clamped to [dt_min, dt_max] after the softplus
    dt_max: float | None = None  # None = no upper bound (the released models)

    @property
    def mixer(self) -> MixerSpec:
        return MixerSpec(self.num_heads, self.head_dim, self.state_size, self.n_groups, self.conv_kernel,
                         self.use_conv_bias, self.use_bias, self.norm_eps, self.dt_min, self.dt_max)  # fmt: skip

    @property
    def intermediate_size(self) -> int:
        return self.mixer.intermediate_size

    @property
    def conv_dim(self) -> int:
        return self.mixer.conv_dim

    @property
    def in_proj_size(self) -> int:
        return self.mixer.in_proj_size

    def validate(self) -> None:
        self.mixer.validate("Mamba-2")

    def describe(self) -> str:
        return (f"(L={self.num_layers} D={self.hidden_size} H={self.num_heads} P={self.head_dim} "
                f"N={self.state_size} G={self.n_groups} V={self.vocab_size})")  # fmt: skip


def _preset(name: str, layers: int, width: int, hf: bool = False) -> Preset:
    config = {"vocab_size": NEOX_VOCAB_ROWS, "hidden_size": width, "num_layers": layers, "num_heads": 2 * width // 64,
              "head_dim": 64, "state_size": 128, "n_groups": 1, "conv_kernel": 4}  # expand 2, headdim 64  # fmt: skip
    size = name.removeprefix("mamba2-")
    if hf:  # the transformers-format copies: safetensors and a tokenizer.json
        return Preset(f"{name}-hf", "mamba2", config,
                      f"state-spaces mamba2-{size} in transformers format, with its tokenizer (L{layers} D{width})",
                      True, HubSource(f"AntonV/mamba2-{size}-hf", confirmed=_COPIES))  # fmt: skip
    # the original releases: mamba_ssm config.json + pytorch_model.bin, no tokenizer
    return Preset(name, "mamba2", config, f"state-spaces {name} (L{layers} D{width}, d_state 128, headdim 64)", True,
                  HubSource(f"state-spaces/mamba2-{size}", confirmed=_ORIGINALS))  # fmt: skip


_ORIGINALS = "repo ids of all five sizes in public code (from_pretrained calls, model registries)"
_COPIES = "repo ids of all five sizes in public code (model registries; AutoTokenizer/AutoModel calls)"
_SIZES = (("mamba2-130m", 24, 768), ("mamba2-370m", 48, 1024), ("mamba2-780m", 48, 1536),
          ("mamba2-1.3b", 48, 2048), ("mamba2-2.7b", 64, 2560))  # fmt: skip

PRESETS = (
    *(_preset(name, layers, width) for name, layers, width in _SIZES),
    *(_preset(name, layers, width, hf=True) for name, layers, width in _SIZES),
    Preset("mamba2-tiny", "mamba2",
           {"vocab_size": 512, "hidden_size": 128, "num_layers": 2, "num_heads": 8, "head_dim": 32, "state_size": 48,
            "n_groups": 2, "conv_kernel": 4},
           "test model: L2 D128, H8 P32 N48, 2 groups, synthetic weights from a fixed seed", released=False),
)  # fmt: skip


def from_transformers(cj: Mapping[str, Any], origin: str) -> Mamba2Config:
    """transformers' Mamba2Config; missing keys take its defaults, as transformers would."""
    r = ConfigReader(cj, origin, "Mamba-2")
    # transformers ignores norm_before_gate and always gates first; mamba_ssm honours it. The
    # two disagree on such a checkpoint, so it is refused rather than guessed.
    r.refuse({f"hidden_act={cj.get('hidden_act')!r}": cj.get("hidden_act", "silu") != "silu",
              "norm_before_gate=true": bool(cj.get("norm_before_gate", False))})  # fmt: skip
    hidden, heads, head_dim = r.int("hidden_size", 4096), r.int("num_heads", 128), r.int("head_dim", 64)
    expand = r.float("expand", 2, positive=True)
    if hidden * expand != heads * head_dim:
        raise CheckpointError(f"{origin}: config.json hidden_size x expand ({hidden} x {expand:g} = {hidden * expand:g}) must "
                              f"equal num_heads x head_dim ({heads} x {head_dim} = {heads * head_dim}): the SSM's inner width")  # fmt: skip
    lo, hi = dt_limit(r, "time_step_limit")
    return Mamba2Config(
        vocab_size=r.int("vocab_size", 32768), hidden_size=hidden, num_layers=r.layers("num_hidden_layers", 64),
        num_heads=heads, head_dim=head_dim, state_size=r.int("state_size", 128), n_groups=r.int("n_groups", 8),
        conv_kernel=r.int("conv_kernel", 4), use_conv_bias=r.bool("use_conv_bias", True),
        use_bias=r.bool("use_bias", False), norm_eps=r.float("layer_norm_epsilon", 1e-5, positive=True),
        residual_in_fp32=r.bool("residual_in_fp32", True), dt_min=lo, dt_max=hi,
    )  # fmt: skip


def is_mamba_ssm(cj: Mapping[str, Any]) -> bool:
    ssm = cj.get("ssm_cfg")
    return "d_model" in cj and isinstance(ssm, Mapping) and ssm.get("layer") == "Mamba2"


def from_mamba_ssm(cj: Mapping[str, Any], origin: str, vocab_rows: int) -> Mamba2Config:
    """mamba_ssm's MambaConfig (state-spaces/mamba2-*): Mamba2 defaults fill ssm_cfg; the vocab
    is the embedding's rows (vocab_size padded to pad_vocab_size_multiple)."""
    r, ssm = ConfigReader(cj, origin, "Mamba-2"), ConfigReader(cj["ssm_cfg"], origin, "Mamba-2")
    s = cj["ssm_cfg"]
    r.refuse({"d_intermediate (an MLP after each mixer)": cj.get("d_intermediate", 0) not in (0, None),
              "attention layers (attn_layer_idx)": bool(cj.get("attn_layer_idx")),
              "rms_norm=false (LayerNorm blocks)": cj.get("rms_norm", True) is not True,
              "ssm_cfg.rmsnorm=false": s.get("rmsnorm", True) is not True,
              "ssm_cfg.norm_before_gate=true": bool(s.get("norm_before_gate", False)),
              "ssm_cfg.D_has_hdim=true": bool(s.get("D_has_hdim", False)),
              "ssm_cfg.d_ssm (a partial SSM)": s.get("d_ssm") is not None})  # fmt: skip
    width, head_dim = r.int("d_model"), ssm.int("headdim", 64)
    inner = ssm.size("d_model*expand", ssm.float("expand", 2, positive=True) * width)
    if inner % head_dim:
        raise CheckpointError(f"{origin}: d_inner {inner} is not a multiple of headdim {head_dim}")
    lo, hi = dt_limit(ssm, "dt_limit")
    return Mamba2Config(
        vocab_size=vocab_rows, hidden_size=width, num_layers=r.layers("n_layer"), num_heads=inner // head_dim,
        head_dim=head_dim, state_size=ssm.int("d_state", 128), n_groups=ssm.int("ngroups", 1),
        conv_kernel=ssm.int("d_conv", 4), use_conv_bias=ssm.bool("conv_bias", True), use_bias=ssm.bool("bias", False),
        norm_eps=r.float("norm_epsilon", 1e-5, positive=True), residual_in_fp32=r.bool("residual_in_fp32", True),
        dt_min=lo, dt_max=hi,
    )  # fmt: skip
