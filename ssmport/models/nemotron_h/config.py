"""Nemotron-H config (transformers' NemotronHConfig: the dense releases and Nemotron-3's MoE
layers), presets, and the dt clamp.

**MoE layers** (`E` in the pattern, transformers' NemotronHMoE): sigmoid scores plus
e_score_correction_bias for the choice, grouped top-k (n_group / topk_group), the chosen
weights divided by their sum + 1e-20 (norm_topk_prob) times routed_scaling_factor, relu^2
experts, and one relu^2 shared expert. A latent expert projection (moe_latent_size) is refused.

**dt is not clamped** (the mixer's MixerSpec has dt_min 0, no dt_max). transformers 5.24's
Nemotron-H mixer passes (time_step_min, inf) to its chunked scan but nothing to its one-token
update, so its own prompt processing and decoding disagree once softplus(dt + dt_bias) falls
below time_step_min (tests/test_hybrid_files.py pins that). NVIDIA's remote code (a public copy
of its modeling_nemotron_h.py) runs, on a GPU, mamba_ssm's kernels: the chunk scan with
dt_limit = time_step_limit, (0, inf) by default, and selective_state_update, which clamps
nothing; only its CPU fallback clamps at time_step_min. mlx-lm clamps to time_step_limit in
both paths. So ssmport follows time_step_limit (the GPU path the models are run with): it
equals transformers' one-token update, and a time_step_limit other than (0, inf) is refused
rather than guessed at (tests/test_nemotron_h.py keeps a fixture with dt below time_step_min)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ssmport.architectures.base import HubSource, Preset
from ssmport.errors import CheckpointError
from ssmport.models.hybrid import (
    ATTENTION,
    DEFAULT_CONTEXT,
    MAMBA,
    MAX_CONTEXT,
    HybridConfig,
    layer_kinds,
    max_positions_from,
    refuse_dt_clamp,
)
from ssmport.models.layers.attention import AttentionSpec
from ssmport.models.layers.mamba2_mixer import MixerSpec
from ssmport.models.loading import ConfigReader
from ssmport.models.moe import SIGMOID, MoeSpec

MLP, MOE = "mlp", "moe"
PATTERN_KINDS = {"M": MAMBA, "*": ATTENTION, "-": MLP, "E": MOE}  # hybrid_override_pattern, one char per layer
NORM_TOPK_EPS = 1e-20  # NemotronHTopkRouter's constant added to the chosen weights' sum
KIND_CHARS = {kind: char for char, kind in PATTERN_KINDS.items()}


@dataclass(frozen=True)
class NemotronHConfig(HybridConfig):
    vocab_size: int
    hidden_size: int  # H
    pattern: str  # hybrid_override_pattern: M Mamba-2, * attention, - MLP; the layers in order
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # F of the relu^2 MLP layers
    mamba_heads: int
    mamba_head_dim: int
    state_size: int  # N
    n_groups: int
    conv_kernel: int = 4
    conv_bias: bool = True
    norm_eps: float = 1e-5  # every RMSNorm, the mixer's gated one included
    context: int = DEFAULT_CONTEXT  # positions the KV cache holds (--context)
    max_position_embeddings: int = MAX_CONTEXT  # what the model was trained for: --context's bound
    # the MoE layers (transformers' key names; unused without "E" in the pattern)
    n_routed_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 7688
    moe_shared_expert_intermediate_size: int = 7688
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0

    @property
    def moe(self) -> MoeSpec:
        return MoeSpec(self.n_routed_experts, self.num_experts_per_tok, self.moe_intermediate_size, SIGMOID,
                       self.norm_topk_prob, NORM_TOPK_EPS, self.routed_scaling_factor, expert_bias=True,
                       shared_width=self.moe_shared_expert_intermediate_size, gated=False, groups=self.n_group,
                       top_groups=self.topk_group)  # fmt: skip

    def is_moe(self, i: int) -> bool:
        return self.layer_types[i] == MOE

    @property
    def layer_types(self) -> tuple[str, ...]:
        return tuple(PATTERN_KINDS.get(c, c) for c in self.pattern)

    @property
    def mixer(self) -> MixerSpec:
        return MixerSpec(self.mamba_heads, self.mamba_head_dim, self.state_size, self.n_groups, self.conv_kernel,
                         self.conv_bias, False, self.norm_eps)  # fmt: skip

    @property
    def attention(self) -> AttentionSpec:
        """No positional encoding, no q/k norm, scale head_dim^-0.5."""
        return AttentionSpec(self.num_heads, self.num_kv_heads, self.head_dim)

    def validate(self) -> None:
        self.check_layers(f"Nemotron-H pattern {self.pattern!r}", tuple(PATTERN_KINDS.values()))
        self.mixer.validate("Nemotron-H")
        if MOE in self.layer_types and self.moe.problems():
            raise CheckpointError(f"Nemotron-H MoE: {'; '.join(self.moe.problems())}")

    def describe(self) -> str:
        moe = f", MoE {self.moe.describe()}" if MOE in self.layer_types else ""
        return (f"({self.pattern}: H={self.hidden_size}, heads {self.num_heads}/{self.num_kv_heads}x{self.head_dim}, "
                f"F={self.intermediate_size}, mamba {self.mamba_heads}x{self.mamba_head_dim} N={self.state_size} "
                f"G={self.n_groups}{moe}, V={self.vocab_size})")  # fmt: skip


def _pattern(cj: Mapping[str, Any], r: ConfigReader) -> str:
    """The layer stack: a `layers_block_type` list (what transformers 5 saves; it wins, as in
    transformers) or the released `hybrid_override_pattern` string."""
    for key in ("layers_block_type", "layer_types"):
        if key in cj:
            kinds = layer_kinds(cj[key], (MAMBA, ATTENTION, MLP, MOE), r, key)
            return "".join(KIND_CHARS[k] for k in kinds)
    pattern = r.raw("hybrid_override_pattern")
    if not isinstance(pattern, str) or not pattern:
        raise CheckpointError(f"{r.origin}: config.json hybrid_override_pattern={pattern!r} is not a layer pattern")
    return pattern


def from_transformers(cj: Mapping[str, Any], origin: str) -> NemotronHConfig:
    """A NemotronHConfig config.json; missing keys take transformers' defaults."""
    r = ConfigReader(cj, origin, "Nemotron-H")
    max_positions = max_positions_from(r)
    pattern = _pattern(cj, r)
    head_dim, eps = r.int("head_dim", 128), r.float("layer_norm_epsilon", 1e-5, positive=True)
    # Keys transformers 5.24 does not read, refused where they would change the model.
    moe = "E" in pattern
    r.refuse({f"unknown layer kind(s) {sorted(set(pattern) - set(PATTERN_KINDS))} in the layer pattern":
                  bool(set(pattern) - set(PATTERN_KINDS)),
              f"scoring_func={cj.get('scoring_func')!r} (Nemotron-H's router scores by sigmoid)":
                  moe and cj.get("scoring_func", "sigmoid") != "sigmoid",
              f"moe_latent_size={cj.get('moe_latent_size')} (a latent expert projection: not implemented)":
                  moe and cj.get("moe_latent_size") is not None,
              f"n_shared_experts={cj.get('n_shared_experts')} (transformers builds one shared expert)":
                  moe and cj.get("n_shared_experts", 1) != 1,
              f"attention_head_dim={cj.get('attention_head_dim')} != head_dim={head_dim} (transformers builds head_dim)":
                  "attention_head_dim" in cj and cj["attention_head_dim"] != head_dim,
              "attention_bias=true (transformers builds no attention biases)": bool(cj.get("attention_bias", False)),
              "mlp_bias=true": bool(cj.get("mlp_bias", False)),
              "Mamba projection biases (use_bias / mamba_proj_bias)": bool(cj.get("use_bias") or cj.get("mamba_proj_bias")),
              f"mlp_hidden_act={cj.get('mlp_hidden_act')!r} (relu2 only)": cj.get("mlp_hidden_act", "relu2") != "relu2",
              f"mamba_hidden_act={cj.get('mamba_hidden_act')!r}": cj.get("mamba_hidden_act", "silu") not in ("silu", "swish"),
              f"rms_norm_eps={cj.get('rms_norm_eps')} != layer_norm_epsilon={eps} (transformers reads the latter)":
                  "rms_norm_eps" in cj and cj["rms_norm_eps"] != eps})  # fmt: skip
    key = "mamba_dt_limit" if "mamba_dt_limit" in cj else "time_step_limit"
    refuse_dt_clamp(r, key, "transformers ignores it, NVIDIA's kernels apply it")
    legacy = lambda new, old, default: r.int(old if old in cj else new, default)  # noqa: E731  (transformers' renames)
    return NemotronHConfig(
        vocab_size=r.int("vocab_size", 131072), hidden_size=r.int("hidden_size", 4096), pattern=pattern,
        num_heads=r.int("num_attention_heads", 32), num_kv_heads=r.int("num_key_value_heads", 8), head_dim=head_dim,
        intermediate_size=r.int("intermediate_size", 21504), mamba_heads=r.int("mamba_num_heads", 128),
        mamba_head_dim=r.int("mamba_head_dim", 64), state_size=r.int("ssm_state_size", 128),
        n_groups=legacy("n_groups", "mamba_n_groups", 8), conv_kernel=legacy("conv_kernel", "mamba_d_conv", 4),
        conv_bias=r.bool("mamba_conv_bias" if "mamba_conv_bias" in cj else "use_conv_bias", True), norm_eps=eps,
        context=min(DEFAULT_CONTEXT, max_positions), max_position_embeddings=max_positions,
        **(_moe_fields(r) if moe else {}),
    )  # fmt: skip


def _moe_fields(r: ConfigReader) -> dict[str, Any]:
    """The MoE keys (transformers' defaults where missing); counts bounded like LFM2-MoE's."""
    d = {k: f.default for k, f in NemotronHConfig.__dataclass_fields__.items()}
    counts = {k: r.int(k, d[k], hi=4096) for k in ("n_routed_experts", "num_experts_per_tok", "n_group", "topk_group")}
    widths = {k: r.int(k, d[k]) for k in ("moe_intermediate_size", "moe_shared_expert_intermediate_size")}
    return counts | widths | dict(norm_topk_prob=r.bool("norm_topk_prob", True),
                                  routed_scaling_factor=r.float("routed_scaling_factor", 1.0, positive=True))


# The dense Nemotron-H releases (docs/hybrids.md section 5): vocab 131072, untied, relu2,
# Mamba-2 state 128, conv 4, 8 groups.
PRESETS = (
    Preset("nemotron-h-4b", "nemotron_h",
           {"vocab_size": 131072, "hidden_size": 3136, "pattern": "M-M-M-MM-M-M*-M-M*-M-M-M*-M-M-MM*-MMM-M-M-",
            "num_heads": 40, "num_kv_heads": 8, "head_dim": 128, "intermediate_size": 12544, "mamba_heads": 96,
            "mamba_head_dim": 80, "state_size": 128, "n_groups": 8},
           "NVIDIA Nemotron-H 4B (42 layers: 21 Mamba-2, 4 attention, 17 MLP; H3136, 40/8 heads, MLP 12544, "
           "mamba 96x80; 3,973,556,832 parameters): third-party config copies, repo id unconfirmed (--weights)",
           True),
    Preset("nemotron-h-8b", "nemotron_h",
           {"vocab_size": 131072, "hidden_size": 4096,
            "pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-", "num_heads": 32, "num_kv_heads": 8,
            "head_dim": 128, "intermediate_size": 21504, "mamba_heads": 128, "mamba_head_dim": 64, "state_size": 128,
            "n_groups": 8},
           "NVIDIA Nemotron-H-8B-Base-8K (52 layers: 24 Mamba-2, 4 attention, 24 MLP; H4096, 32/8 heads, mamba 128x64; "
           "MLP 21504 unconfirmed: transformers' default)", True,
           HubSource("nvidia/Nemotron-H-8B-Base-8K",
                     confirmed="named by third-party config copies; the paper's 47B/56B repos are named alike")),
    # Nemotron-3 Nano: the widths from a public copy of its config.json (a third-party test file,
    # transformers_version 4.55.4); 23 Mamba-2 + 23 MoE + 6 attention layers, 128 experts top 6
    # + one shared expert, routed_scaling_factor 2.5, no groups (n_group 1).
    Preset("nemotron-3-nano-30b-a3b", "nemotron_h",
           {"vocab_size": 131072, "hidden_size": 2688, "pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
            "num_heads": 32, "num_kv_heads": 2, "head_dim": 128, "intermediate_size": 1856, "mamba_heads": 64,
            "mamba_head_dim": 64, "state_size": 128, "n_groups": 8, "n_routed_experts": 128, "num_experts_per_tok": 6,
            "moe_intermediate_size": 1856, "moe_shared_expert_intermediate_size": 3712, "n_group": 1, "topk_group": 1,
            "routed_scaling_factor": 2.5, "max_position_embeddings": 262144},
           "NVIDIA Nemotron-3 Nano 30B-A3B (52 layers: 23 Mamba-2, 23 MoE of 6 of 128 relu^2 experts x 1856 + a shared "
           "3712, 6 attention; H2688, 32/2 heads; widths from a third-party copy of its config.json)", True,
           HubSource("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
                     confirmed="named by third-party pages and quantized derivatives; config from a third-party copy")),
    Preset("nemotron-h-tiny", "nemotron_h",
           {"vocab_size": 512, "hidden_size": 128, "pattern": "M*-M-*M", "num_heads": 4, "num_kv_heads": 2, "head_dim": 48,
            "intermediate_size": 256, "mamba_heads": 8, "mamba_head_dim": 32, "state_size": 48, "n_groups": 2,
            "context": 64},
           "test model: pattern M*-M-*M, H128, 4/2 heads of 48 (heads x head_dim != H), mamba 8x32 N48 G2, "
           "synthetic weights from a fixed seed", released=False),
    Preset("nemotron-moe-tiny", "nemotron_h",
           {"vocab_size": 512, "hidden_size": 128, "pattern": "M*E-EME", "num_heads": 4, "num_kv_heads": 2, "head_dim": 48,
            "intermediate_size": 256, "mamba_heads": 8, "mamba_head_dim": 32, "state_size": 48, "n_groups": 2,
            "n_routed_experts": 12, "num_experts_per_tok": 3, "moe_intermediate_size": 64,
            "moe_shared_expert_intermediate_size": 96, "n_group": 3, "topk_group": 2, "routed_scaling_factor": 2.5,
            "context": 64},
           "test model: pattern M*E-EME, 3 of 12 relu^2 experts x 64 from 2 of 3 groups + a shared 96, "
           "synthetic weights from a fixed seed", released=False),
)  # fmt: skip
