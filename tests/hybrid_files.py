"""Tiny hybrid checkpoints written with transformers' own classes, and reference helpers.

Four families (docs/hybrids.md has the math, names and layouts these fixtures exercise):

    Qwen3.5       Qwen3_5ForCausalLM (`qwen3_5_text`) and the released packaging
                  Qwen3_5ForConditionalGeneration (`qwen3_5`: text under `text_config`,
                  `model.language_model.*`, a vision tower, extra `mtp.*` tensors)
    LFM2          Lfm2ForCausalLM (`lfm2`), conv and full-attention layers
    Granite-4.0-H GraniteMoeHybridForCausalLM (`granitemoehybrid`), dense: no routed experts
    Nemotron-H    NemotronHForCausalLM (`nemotron_h`), `hybrid_override_pattern` of M, * and -
    Falcon-H1     FalconH1ForCausalLM (`falcon_h1`), attention and Mamba-2 in every layer, µP multipliers

Each writer builds the model from a config with transformers' class, overwrites every
parameter with seeded, trained-like values (norm weights away from their init so that a
norm convention mix-up shows, decays spread out, dt in a sane range), saves it with
`save_pretrained` and rewrites the few config keys released files spell differently
(Granite's "mamba"/"attention" layer types, Nemotron-H's pattern string, LFM2's legacy
keys). Shapes are deliberately non-square: kv heads != heads, k dim != v dim, v heads !=
k heads, Mamba head_dim != state size, so a transposed or regrouped state cannot pass.

The reference helpers run transformers' pure-torch paths only (`assert_torch_paths`):
`reference_run` feeds a token list one token at a time through transformers' cache and
once as a whole sequence, checks that both agree, and returns the logits and the cache
stacked into one tensor per state kind (`stacked_states`).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

# Packages transformers would pick over its torch code when importable (fla and
# flash-linear-attention are one package, `fla`; `kernels` is the Hub kernels client).
KERNEL_PACKAGES = ("fla", "causal_conv1d", "mamba_ssm", "kernels", "flash_attn")
MODELING_MODULES = (
    "transformers.models.qwen3_5.modeling_qwen3_5",
    "transformers.models.lfm2.modeling_lfm2",
    "transformers.models.lfm3.modeling_lfm3",  # tests/lfm3_files.py
    "transformers.models.granitemoehybrid.modeling_granitemoehybrid",
    "transformers.models.nemotron_h.modeling_nemotron_h",
    "transformers.models.olmo_hybrid.modeling_olmo_hybrid",
    "transformers.models.falcon_h1.modeling_falcon_h1",
    "transformers.models.lfm2_moe.modeling_lfm2_moe",  # the MoE hybrids (tests/moe_files.py)
    "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
)

# fp32 agreement of transformers' cached token-by-token path with its full-sequence path
# (different algorithms: recurrent step vs chunked scan, conv update vs padded conv).
STEP_VS_FULL_RTOL = 1e-4

# The four stacked states, in Apple's names (coreai-models `_constants.py`).
KEY_CACHE, VALUE_CACHE, CONV_STATES, RECURRENT_STATES = "keyCache", "valueCache", "convStates", "recurrentStates"


# --------------------------------------------------------------------------- guard


def assert_torch_paths() -> None:
    """Fail unless transformers runs its own torch code for every hybrid op.

    transformers 5.24 wraps each op (`causal_conv1d_update`, `torch_chunk_gated_delta_rule`,
    `mamba2_chunk_scan`, ...) in `use_kernel_func_from_hub_with_fallback`, which binds the
    kernel package's function at import time if the package imports; the wrapper keeps
    that choice in its closure as `is_new_implementation`.
    """
    present = [p for p in KERNEL_PACKAGES if importlib.util.find_spec(p) is not None]
    assert not present, f"kernel packages importable, transformers would use them: {present}"
    from transformers.integrations import hub_kernels

    assert not hub_kernels.is_kernels_available(), "the `kernels` hub package is available"
    checked = 0
    for name in MODELING_MODULES:
        module = importlib.import_module(name)
        for fn in vars(module).values():
            code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
            if code is None or not cells or "is_new_implementation" not in code.co_freevars:
                continue
            chosen = dict(zip(code.co_freevars, (c.cell_contents for c in cells)))
            assert not chosen["is_new_implementation"], f"{name}.{fn.__name__} is bound to {chosen['package']}"
            checked += 1
    assert checked >= 4 * 2, f"found only {checked} kernel-wrapped ops: transformers' wrapper changed"


# --------------------------------------------------------------------------- dims


@dataclass(frozen=True)
class Qwen35Dims:
    vocab: int = 96
    hidden: int = 48
    ffn: int = 80
    layer_types: tuple[str, ...] = ("linear_attention", "linear_attention", "full_attention",
                                    "linear_attention", "full_attention")  # fmt: skip
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    linear_k_heads: int = 2
    linear_v_heads: int = 4  # GVA: 2 value heads per q/k head
    linear_k_dim: int = 8
    linear_v_dim: int = 12
    conv: int = 4
    partial_rotary: float = 0.5  # rotary dim 8 of head_dim 16
    rope_theta: float = 10000.0
    mrope_section: tuple[int, int, int] = (2, 1, 1)  # sums to rotary_dim / 2
    eps: float = 1e-6
    tied: bool = False


@dataclass(frozen=True)
class VisionDims:
    depth: int = 1
    hidden: int = 16
    heads: int = 2
    intermediate: int = 32
    patch: int = 4
    temporal_patch: int = 2
    merge: int = 2
    positions: int = 16


@dataclass(frozen=True)
class Lfm2Dims:
    vocab: int = 96
    hidden: int = 48
    layer_types: tuple[str, ...] = ("conv", "conv", "full_attention", "conv", "full_attention")
    heads: int = 4  # head_dim 12
    kv_heads: int = 2
    ff_dim: int = 128  # auto-adjusted: int(2 * 128 / 3) = 85 -> rounded up to 96
    multiple_of: int = 16
    conv: int = 3  # conv_L_cache: the short conv's kernel width
    conv_bias: bool = False
    rope_theta: float = 1e6
    eps: float = 1e-5
    tied: bool = True

    @property
    def mlp_width(self) -> int:
        w = int(2 * self.ff_dim / 3)
        return self.multiple_of * math.ceil(w / self.multiple_of)


@dataclass(frozen=True)
class GraniteDims:
    vocab: int = 96
    hidden: int = 48
    layer_types: tuple[str, ...] = ("mamba", "attention", "mamba", "mamba", "attention")  # released spelling
    heads: int = 4  # head_dim 12
    kv_heads: int = 2
    shared_ffn: int = 64
    mamba_heads: int = 6
    mamba_head_dim: int = 16  # 6 * 16 = expand 2 * hidden
    groups: int = 2
    state: int = 8
    conv: int = 4
    multipliers: dict = field(default_factory=lambda: {
        "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
        "attention_multiplier": 0.0625, "logits_scaling": 4.0})  # fmt: skip
    position_embedding_type: str = "nope"
    rope_theta: float = 10000.0
    eps: float = 1e-5
    tied: bool = True


@dataclass(frozen=True)
class NemotronDims:
    vocab: int = 96
    hidden: int = 48
    pattern: str = "M*-M-*M"  # M Mamba-2, * attention, - MLP
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16  # explicit, != hidden / heads
    ffn: int = 80
    mamba_heads: int = 4
    mamba_head_dim: int = 20
    groups: int = 2
    state: int = 8
    conv: int = 4
    eps: float = 1e-5


@dataclass(frozen=True)
class FalconDims:
    vocab: int = 96
    hidden: int = 48
    layers: int = 3
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16  # explicit, != hidden / heads
    ffn: int = 80
    mamba_heads: int = 6
    mamba_head_dim: int = 10  # d_ssm 60, != mamba_expand * hidden
    groups: int = 2
    state: int = 8
    conv: int = 4
    rms_norm: bool = True  # mamba_rms_norm
    norm_before_gate: bool = False  # mamba_norm_before_gate (released: false)
    multipliers: dict = field(default_factory=lambda: {
        "embedding_multiplier": 3.0, "lm_head_multiplier": 0.4, "attention_in_multiplier": 0.8,
        "attention_out_multiplier": 0.6, "key_multiplier": 0.5, "ssm_in_multiplier": 1.25, "ssm_out_multiplier": 0.7,
        "mlp_multipliers": [0.9, 0.6], "ssm_multipliers": [0.35, 0.25, 0.5, 0.75, 0.4]})  # fmt: skip
    rope_theta: float = 10000.0
    eps: float = 1e-5
    tied: bool = False


# --------------------------------------------------------------------------- weights


def _fill_trained_like(model: torch.nn.Module, seed: int) -> None:
    """Overwrite every parameter with seeded values of trained-like scale.

    Zero-centred norms (Qwen3.5's `x * (1 + w)`) get w ~ N(0, 0.1), plain norms w ~ N(1, 0.1):
    either way a convention mix-up moves the output. Decays A = exp(A_log) in [1, 16];
    dt_bias = softplus^-1(dt), dt in [0.02, 0.2] (above Nemotron-H's time_step_min, so
    transformers' decode and chunked paths agree; docs/hybrids.md).
    """
    g = torch.Generator().manual_seed(seed)

    def normal(shape, mean=0.0, std=1.0):
        return mean + std * torch.randn(shape, generator=g)

    seen: set[int] = set()
    for mod_name, module in sorted(model.named_modules(), key=lambda kv: kv[0]):
        zero_centred = type(module).__name__ == "Qwen3_5RMSNorm"
        for p_name, p in sorted(module.named_parameters(recurse=False)):
            if id(p) in seen:  # tied head
                continue
            seen.add(id(p))
            full = f"{mod_name}.{p_name}"
            shape = p.shape
            if isinstance(module, torch.nn.Embedding):
                value = normal(shape)
            elif p_name == "A_log":
                value = torch.empty(shape).uniform_(1.0, 16.0, generator=g).log()
            elif p_name == "dt_bias":
                dt = torch.exp(torch.empty(shape).uniform_(math.log(0.02), math.log(0.2), generator=g))
                value = dt + torch.log(-torch.expm1(-dt))
            elif p_name == "D":
                value = normal(shape, 1.0, 0.1)
            elif p.ndim == 1 and "norm" in full:
                value = normal(shape, 0.0 if zero_centred else 1.0, 0.1)
            elif p_name == "bias":
                value = normal(shape, 0.0, 0.1)
            elif "conv" in mod_name and p.ndim == 3 and shape[1] == 1:  # depthwise causal conv
                value = normal(shape, 0.0, 0.5)
            else:
                value = normal(shape, 0.0, (p.numel() // shape[0]) ** -0.5)
            with torch.no_grad():
                p.copy_(value)


def _save(model: torch.nn.Module, folder: Path, config_edit=None, family: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    if config_edit is not None:
        path = folder / "config.json"
        config = json.loads(path.read_text())
        config_edit(config)
        path.write_text(json.dumps(config, indent=2))
    write_tokenizer(folder, vocab=model.config.get_text_config().vocab_size, family=family)
    return folder


# --------------------------------------------------------------------------- Qwen3.5


def _qwen35_text_config(d: Qwen35Dims) -> dict:
    return {
        "vocab_size": d.vocab, "hidden_size": d.hidden, "intermediate_size": d.ffn,
        "num_hidden_layers": len(d.layer_types), "layer_types": list(d.layer_types),
        "num_attention_heads": d.heads, "num_key_value_heads": d.kv_heads, "head_dim": d.head_dim,
        "linear_num_key_heads": d.linear_k_heads, "linear_num_value_heads": d.linear_v_heads,
        "linear_key_head_dim": d.linear_k_dim, "linear_value_head_dim": d.linear_v_dim,
        "linear_conv_kernel_dim": d.conv, "rms_norm_eps": d.eps, "tie_word_embeddings": d.tied,
        "max_position_embeddings": 256, "eos_token_id": 2,
        "rope_parameters": {"rope_type": "default", "rope_theta": d.rope_theta,
                            "partial_rotary_factor": d.partial_rotary,
                            "mrope_section": list(d.mrope_section), "mrope_interleaved": True},
    }  # fmt: skip


# Keys released Qwen3.5 text configs carry that transformers 5.24 does not model (it reads
# none of them; docs/hybrids.md says which ssmport must check).
QWEN35_RELEASED_TEXT_KEYS = {"attn_output_gate": True, "full_attention_interval": 4, "mamba_ssm_dtype": "float32",
                             "mlp_only_layers": [], "mtp_num_hidden_layers": 1,
                             "mtp_use_dedicated_embeddings": False}  # fmt: skip


def _qwen35_text_model(d: Qwen35Dims, seed: int):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**_qwen35_text_config(d))).eval()
    _fill_trained_like(model, seed)
    return model


def write_qwen35_text(folder: Path, d: Qwen35Dims = Qwen35Dims(), seed: int = 0) -> Path:
    """A text-only `Qwen3_5ForCausalLM` folder (`model_type` qwen3_5_text, `model.*` names)."""
    model = _qwen35_text_model(d, seed)
    return _save(model, folder, lambda c: c.update(QWEN35_RELEASED_TEXT_KEYS), family="qwen3_5")


def qwen35_mtp_tensors(d: Qwen35Dims, seed: int) -> dict[str, torch.Tensor]:
    """The 15 `mtp.*` tensors released Qwen3.5 files carry (one full-attention MTP layer)."""
    g = torch.Generator().manual_seed(seed + 7)
    H, q, kv = d.hidden, d.heads * d.head_dim, d.kv_heads * d.head_dim
    L = "mtp.layers.0."
    shapes = {
        "mtp.fc.weight": (H, 2 * H), "mtp.norm.weight": (H,),
        "mtp.pre_fc_norm_embedding.weight": (H,), "mtp.pre_fc_norm_hidden.weight": (H,),
        L + "input_layernorm.weight": (H,), L + "post_attention_layernorm.weight": (H,),
        L + "self_attn.q_proj.weight": (2 * q, H), L + "self_attn.k_proj.weight": (kv, H),
        L + "self_attn.v_proj.weight": (kv, H), L + "self_attn.o_proj.weight": (H, q),
        L + "self_attn.q_norm.weight": (d.head_dim,), L + "self_attn.k_norm.weight": (d.head_dim,),
        L + "mlp.gate_proj.weight": (d.ffn, H), L + "mlp.up_proj.weight": (d.ffn, H),
        L + "mlp.down_proj.weight": (H, d.ffn),
    }  # fmt: skip
    return {k: 0.1 * torch.randn(s, generator=g) for k, s in shapes.items()}


def write_qwen35_vlm(folder: Path, d: Qwen35Dims = Qwen35Dims(), seed: int = 0, vision: VisionDims = VisionDims(),
                     mtp: bool = True) -> Path:  # fmt: skip
    """The released packaging: a `Qwen3_5ForConditionalGeneration` folder whose language
    model has exactly the weights `write_qwen35_text(d, seed)` writes, plus a tiny vision
    tower (`model.visual.*`) and the `mtp.*` tensors, in two shards named as released.

    Top-level `tie_word_embeddings` (what the VLM class ties by) equals the text config's.
    """
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = _qwen35_text_model(d, seed)
    vision_config = {
        "depth": vision.depth, "hidden_size": vision.hidden, "num_heads": vision.heads,
        "intermediate_size": vision.intermediate, "patch_size": vision.patch,
        "temporal_patch_size": vision.temporal_patch, "spatial_merge_size": vision.merge,
        "out_hidden_size": d.hidden, "num_position_embeddings": vision.positions,
    }  # fmt: skip
    config = Qwen3_5Config(text_config=_qwen35_text_config(d), vision_config=vision_config, tie_word_embeddings=d.tied)
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(config).eval()
    _fill_trained_like(model.model.visual, seed + 1)
    missing, unexpected = model.model.language_model.load_state_dict(text.model.state_dict(), strict=True)
    assert not missing and not unexpected
    if not d.tied:
        with torch.no_grad():
            model.lm_head.weight.copy_(text.lm_head.weight)

    def edit(c):
        c["text_config"].update(QWEN35_RELEASED_TEXT_KEYS)
        c["vision_config"]["model_type"] = "qwen3_5"  # as released; transformers maps it
        c["vision_config"]["deepstack_visual_indexes"] = []

    _save(model, folder, edit, family="qwen3_5")
    _reshard_as_released(folder, qwen35_mtp_tensors(d, seed) if mtp else {})
    return folder


def _reshard_as_released(folder: Path, extra: dict[str, torch.Tensor], shards: int = 2) -> None:
    """Rewrite `model.safetensors` plus `extra` as released Qwen3.5 repos name their files
    (`model.safetensors-0000i-of-0000n.safetensors` and `model.safetensors.index.json`)."""
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()} | extra
    names = sorted(tensors)
    per = math.ceil(len(names) / shards)
    weight_map = {}
    for i in range(shards):
        fname = f"model.safetensors-{i + 1:05d}-of-{shards:05d}.safetensors"
        chunk = {n: tensors[n].contiguous() for n in names[i * per : (i + 1) * per]}
        save_file(chunk, str(folder / fname), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(chunk, fname)
    (folder / "model.safetensors").unlink()
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


# --------------------------------------------------------------------------- LFM2


def write_lfm2(folder: Path, d: Lfm2Dims = Lfm2Dims(), seed: int = 0, legacy_keys: bool = False) -> Path:
    """An `Lfm2ForCausalLM` folder. `legacy_keys`: spell the config as the first LFM2 releases
    do (`full_attn_idxs`, `block_ff_dim`, `tie_embedding`, `rope_theta`) instead of
    `layer_types` / `intermediate_size` / `tie_word_embeddings` / `rope_parameters`."""
    from transformers import Lfm2Config, Lfm2ForCausalLM

    config = Lfm2Config(
        vocab_size=d.vocab, hidden_size=d.hidden, intermediate_size=d.ff_dim, num_hidden_layers=len(d.layer_types),
        layer_types=list(d.layer_types), num_attention_heads=d.heads, num_key_value_heads=d.kv_heads,
        block_multiple_of=d.multiple_of, block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=True,
        conv_L_cache=d.conv, conv_bias=d.conv_bias, norm_eps=d.eps, tie_word_embeddings=d.tied,
        rope_parameters={"rope_type": "default", "rope_theta": d.rope_theta}, max_position_embeddings=256,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Lfm2ForCausalLM(config).eval()
    _fill_trained_like(model, seed)

    def edit(c):
        if legacy_keys:
            c["full_attn_idxs"] = [i for i, t in enumerate(c.pop("layer_types")) if t == "full_attention"]
            c["block_ff_dim"] = c.pop("intermediate_size")
            c["tie_embedding"] = c.pop("tie_word_embeddings")
            c["rope_theta"] = c.pop("rope_parameters")["rope_theta"]
            c["block_dim"] = c["conv_dim"] = c["hidden_size"]  # carried, unused by transformers
        else:
            c.pop("full_attn_idxs", None)

    return _save(model, folder, edit, family="lfm2")


# --------------------------------------------------------------------------- Granite-4.0-H


def write_granite_h(folder: Path, d: GraniteDims = GraniteDims(), seed: int = 0) -> Path:
    """A dense `GraniteMoeHybridForCausalLM` folder (`num_local_experts` 0, the shared MLP
    only), its config spelled as released: layer types "mamba"/"attention", `rope_theta`."""
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    config = GraniteMoeHybridConfig(
        vocab_size=d.vocab, hidden_size=d.hidden, intermediate_size=d.shared_ffn, shared_intermediate_size=d.shared_ffn,
        num_hidden_layers=len(d.layer_types), layer_types=list(d.layer_types), num_attention_heads=d.heads,
        num_key_value_heads=d.kv_heads, num_local_experts=0, num_experts_per_tok=0, mamba_n_heads=d.mamba_heads,
        mamba_d_head=d.mamba_head_dim, mamba_n_groups=d.groups, mamba_d_state=d.state, mamba_d_conv=d.conv,
        mamba_expand=d.mamba_heads * d.mamba_head_dim // d.hidden, mamba_conv_bias=True, mamba_proj_bias=False,
        position_embedding_type=d.position_embedding_type, rms_norm_eps=d.eps, tie_word_embeddings=d.tied,
        rope_parameters={"rope_type": "default", "rope_theta": d.rope_theta}, max_position_embeddings=256,
        **d.multipliers,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = GraniteMoeHybridForCausalLM(config).eval()
    _fill_trained_like(model, seed)

    def edit(c):
        c["layer_types"] = list(d.layer_types)
        c["rope_theta"] = c.pop("rope_parameters")["rope_theta"]
        c["rope_scaling"] = None
        c["normalization_function"] = "rmsnorm"

    return _save(model, folder, edit, family="granite")


# --------------------------------------------------------------------------- Nemotron-H


def write_nemotron_h(folder: Path, d: NemotronDims = NemotronDims(), seed: int = 0) -> Path:
    """A dense `NemotronHForCausalLM` folder (`backbone.*` names as released), its layer
    stack spelled as `hybrid_override_pattern`."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    config = NemotronHConfig(
        vocab_size=d.vocab, hidden_size=d.hidden, hybrid_override_pattern=d.pattern, num_attention_heads=d.heads,
        num_key_value_heads=d.kv_heads, head_dim=d.head_dim, intermediate_size=d.ffn, mamba_num_heads=d.mamba_heads,
        mamba_head_dim=d.mamba_head_dim, n_groups=d.groups, ssm_state_size=d.state, conv_kernel=d.conv,
        use_conv_bias=True, layer_norm_epsilon=d.eps, tie_word_embeddings=False, max_position_embeddings=256,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = NemotronHForCausalLM(config).eval()
    _fill_trained_like(model, seed)

    def edit(c):
        c.pop("layers_block_type")
        c["hybrid_override_pattern"] = d.pattern
        c["num_hidden_layers"] = len(d.pattern)

    return _save(model, folder, edit, family="nemotron_h")


# --------------------------------------------------------------------------- Falcon-H1


def write_falcon_h1(folder: Path, d: FalconDims = FalconDims(), seed: int = 0) -> Path:
    """A `FalconH1ForCausalLM` folder, its config spelled as released (top-level `rope_theta`,
    the keys transformers does not read: `attn_layer_indices`, `mamba_use_mlp`, ...)."""
    from transformers import FalconH1Config, FalconH1ForCausalLM

    config = FalconH1Config(
        vocab_size=d.vocab, hidden_size=d.hidden, num_hidden_layers=d.layers, num_attention_heads=d.heads,
        num_key_value_heads=d.kv_heads, head_dim=d.head_dim, intermediate_size=d.ffn, mamba_n_heads=d.mamba_heads,
        mamba_d_head=d.mamba_head_dim, mamba_d_ssm=d.mamba_heads * d.mamba_head_dim, mamba_n_groups=d.groups,
        mamba_d_state=d.state, mamba_d_conv=d.conv, mamba_rms_norm=d.rms_norm, mamba_norm_before_gate=d.norm_before_gate,
        rms_norm_eps=d.eps, tie_word_embeddings=d.tied, max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": d.rope_theta}, **d.multipliers,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = FalconH1ForCausalLM(config).eval()
    _fill_trained_like(model, seed)

    def edit(c):
        c["rope_theta"] = c.pop("rope_parameters")["rope_theta"]
        c |= {"rope_scaling": None, "attn_layer_indices": None, "mamba_use_mlp": True, "mlp_expansion_factor": 8}

    return _save(model, folder, edit, family="falcon_h1")


# --------------------------------------------------------------------------- tokenizer

TOKENIZER_TEXTS = ["the state of a recurrent model is fixed in size", "attention keeps a cache of keys and values",
                   "hello world, how are you today?", "def add(a, b): return a + b"]  # fmt: skip
# Chat markers per family (the released templates differ; these only need to render).
CHAT_TOKENS = {
    "qwen3_5": ("<|im_start|>", "<|im_end|>", "<|endoftext|>"),
    "lfm2": ("<|im_start|>", "<|im_end|>", "<|startoftext|>"),
    "lfm3": ("<|im_start|>", "<|im_end|>", "<|startoftext|>"),
    "granite": ("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>"),
    "nemotron_h": ("<SPECIAL_10>", "<SPECIAL_11>", "</s>"),
    "falcon_h1": ("<|im_start|>", "<|im_end|>", "<|end_of_text|>"),
    "recurrent_gemma": ("<start_of_turn>", "<end_of_turn>", "<eos>"),
}


@functools.lru_cache(maxsize=None)
def _tokenizer_json(vocab: int, family: str) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    start, end, eos = CHAT_TOKENS[family]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab - 8, special_tokens=["<unk>", eos, start, end])
    tok.train_from_iterator(TOKENIZER_TEXTS * 10, trainer)
    assert tok.get_vocab_size() <= vocab
    return tok.to_str()


def write_tokenizer(folder: Path, vocab: int, family: str) -> None:
    """A small trained BPE `tokenizer.json` (ids < `vocab`) and a `tokenizer_config.json`
    with a ChatML-style chat template using the family's marker tokens."""
    start, end, eos = CHAT_TOKENS[family]
    (folder / "tokenizer.json").write_text(_tokenizer_json(vocab, family))
    template = (
        "{% for m in messages %}" + start + "{{ m['role'] }}\n{{ m['content'] }}" + end + "\n{% endfor %}"
        "{% if add_generation_prompt %}" + start + "assistant\n{% endif %}"
    )
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "unk_token": "<unk>",
              "pad_token": eos, "model_max_length": 256, "chat_template": template}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


# --------------------------------------------------------------------------- layer permutation


def layer_types_of(config: dict) -> list[str]:
    """A folder's per-layer kinds in transformers' names (legacy spellings mapped)."""
    text = config.get("text_config", config)
    if "hybrid_override_pattern" in text:
        return [{"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}[c]
                for c in text["hybrid_override_pattern"]]  # fmt: skip
    if "layer_types" in text:
        return [{"mamba": "linear_attention", "attention": "full_attention"}.get(t, t) for t in text["layer_types"]]
    idxs = set(text["full_attn_idxs"])
    return ["full_attention" if i in idxs else "conv" for i in range(text["num_hidden_layers"])]


def write_permuted(src: Path, dst: Path, order: list[int]) -> Path:
    """Copy a text-only folder with its layers reordered: new layer j is old layer order[j]
    (tensors renamed, the config's layer kinds permuted in the folder's own spelling)."""
    import re

    config = json.loads((src / "config.json").read_text())
    assert "text_config" not in config, "permute text-only folders"
    position = {old: new for new, old in enumerate(order)}
    tensors = {}
    for f in sorted(src.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            for k in h.keys():
                m = re.match(r"^(.*?\blayers\.)(\d+)(\..*)$", k)
                name = f"{m[1]}{position[int(m[2])]}{m[3]}" if m else k
                tensors[name] = h.get_tensor(k)
    if "hybrid_override_pattern" in config:
        config["hybrid_override_pattern"] = "".join(config["hybrid_override_pattern"][i] for i in order)
    elif "layer_types" in config:
        config["layer_types"] = [config["layer_types"][i] for i in order]
    else:
        kinds = layer_types_of(config)
        config["full_attn_idxs"] = [j for j, i in enumerate(order) if kinds[i] == "full_attention"]
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    return dst


# --------------------------------------------------------------------------- reference


def load_transformers(folder: Path):
    """transformers' own model for a fixture folder (class from `architectures`), fp32, eval."""
    import transformers

    assert_torch_paths()
    name = json.loads((Path(folder) / "config.json").read_text())["architectures"][0]
    assert name in ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration", "Lfm2ForCausalLM", "Lfm3ForCausalLM",
                    "GraniteMoeHybridForCausalLM", "NemotronHForCausalLM", "FalconH1ForCausalLM",
                    "Lfm2MoeForCausalLM", "Qwen3_5MoeForCausalLM"), name  # fmt: skip
    model = getattr(transformers, name).from_pretrained(str(folder), dtype=torch.float32)
    return model.eval()


@dataclass
class ReferenceRun:
    logits: torch.Tensor  # [T, V] full-sequence forward, no cache
    step_logits: torch.Tensor  # [T, V] one token per call through transformers' cache
    cache: object  # transformers' DynamicCache after the token-by-token run
    prefill_cache: object  # the cache a single full-sequence call with use_cache=True leaves


@torch.no_grad()
def reference_run(folder: Path, tokens: list[int], model=None) -> ReferenceRun:
    """Run `tokens` through transformers twice (token by token with its cache, and as one
    sequence) and check that the logits and the caches agree to fp32 precision."""
    model = model if model is not None else load_transformers(folder)
    ids = torch.tensor([tokens])
    full = model(ids, use_cache=False).logits[0].float()
    prefill_cache = model(ids, use_cache=True).past_key_values
    cache, rows = None, []
    for t in tokens:
        out = model(torch.tensor([[t]]), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        rows.append(out.logits[0, -1].float())
    steps = torch.stack(rows)
    scale = max(1.0, full.abs().max().item())
    torch.testing.assert_close(steps, full, rtol=0, atol=STEP_VS_FULL_RTOL * scale)
    a, b = stacked_states(cache), stacked_states(prefill_cache)
    assert a.keys() == b.keys()
    for name in a:
        s = max(1.0, b[name].abs().max().item())
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=STEP_VS_FULL_RTOL * s, msg=name)
    return ReferenceRun(full, steps, cache, prefill_cache)


@torch.no_grad()
def full_logits(folder: Path, tokens: list[int]) -> torch.Tensor:
    """fp32 logits [T, V] of one full-sequence forward, no cache (no cross-check)."""
    return load_transformers(folder)(torch.tensor([tokens]), use_cache=False).logits[0].float()


def reference_logits(folder: Path, tokens: list[int]) -> torch.Tensor:
    """fp32 logits [T, V] of transformers' model, checked: cached token-by-token == full."""
    return reference_run(folder, tokens).logits


def stacked_states(cache, context: int | None = None) -> dict[str, torch.Tensor]:
    """transformers' per-layer cache as one tensor per state kind, rows in layer order
    among the layers of that kind (Apple's `cache_layer_idx` convention):

        keyCache, valueCache  [L_attn, 1, kv_heads, context, head_dim]  <- layer.keys / .values
                              [1, kv_heads, T, head_dim] (K after k-norm and RoPE where the
                              model has them); positions >= T zero-padded up to `context`
        convStates            [L_conv, 1, K, conv_dim]  <- layer.conv_states[0] [1, conv_dim, K]
                              transposed to time-major (Apple's layout); the K most recent
                              pre-conv inputs, oldest first (row 0 is never read by the next step)
        recurrentStates       [L_rec, 1, *state]  <- layer.recurrent_states[0] unchanged:
                              Qwen3.5 [1, v_heads, k_dim, v_dim], Mamba-2 [1, heads, head_dim, d_state]

    Kinds a model lacks are absent (LFM2 has no recurrent state).
    """
    from transformers.cache_utils import DynamicLayer, LinearAttentionLayer

    keys, values, convs, recs = [], [], [], []
    for layer in cache.layers:
        if isinstance(layer, LinearAttentionLayer):
            convs.append(layer.conv_states[0].transpose(-1, -2))
            if layer.recurrent_states[0] is not None:
                recs.append(layer.recurrent_states[0])
        if isinstance(layer, DynamicLayer):  # Falcon-H1's layers are both kinds
            k, v = layer.keys, layer.values
            if context is not None:
                pad = (0, 0, 0, context - k.shape[-2])
                k, v = torch.nn.functional.pad(k, pad), torch.nn.functional.pad(v, pad)
            keys.append(k)
            values.append(v)
    out = {}
    for name, rows in ((KEY_CACHE, keys), (VALUE_CACHE, values), (CONV_STATES, convs), (RECURRENT_STATES, recs)):
        if rows:
            out[name] = torch.stack(rows).float().clone()
    return out


def reference_states(folder: Path, tokens: list[int], context: int | None = None) -> dict[str, torch.Tensor]:
    """The stacked states (see `stacked_states`) transformers holds after `tokens`."""
    return stacked_states(reference_run(folder, tokens).cache, context)


# --------------------------------------------------------------------------- the standard set


def write_all(root: Path) -> dict[str, Path]:
    """Every standard fixture under `root`, by name (what tests/test_hybrid_files.py uses)."""
    root = Path(root)
    return {
        "qwen35-text": write_qwen35_text(root / "qwen35-text", Qwen35Dims(tied=False), seed=1),
        "qwen35-text-tied": write_qwen35_text(root / "qwen35-text-tied", Qwen35Dims(tied=True), seed=2),
        "qwen35-vlm": write_qwen35_vlm(root / "qwen35-vlm", Qwen35Dims(tied=False), seed=1),
        "qwen35-vlm-tied": write_qwen35_vlm(root / "qwen35-vlm-tied", Qwen35Dims(tied=True), seed=2),
        "lfm2": write_lfm2(root / "lfm2", Lfm2Dims(), seed=3),
        "lfm2-legacy": write_lfm2(root / "lfm2-legacy", Lfm2Dims(), seed=3, legacy_keys=True),
        "granite-h": write_granite_h(root / "granite-h", GraniteDims(), seed=4),
        "nemotron-h": write_nemotron_h(root / "nemotron-h", NemotronDims(), seed=5),
    }

