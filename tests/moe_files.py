"""Tiny mixture-of-experts hybrid checkpoints written with transformers' own classes
(`Lfm2MoeForCausalLM`, `Qwen3_5MoeForCausalLM`, `NemotronHForCausalLM` with MoE layers,
`GraniteMoeHybridForCausalLM` with experts), like tests/hybrid_files.py's dense ones, and a
capture of the experts transformers' routers choose.

Routing must be non-trivial on these: the experts' weights get fan-in scales (transformers'
3-D stacks would otherwise get 1/sqrt(2F*C) from the generic fill), LFM2-MoE's expert bias
and Nemotron-H's e_score_correction_bias (buffers the generic fill skips) get N(0, 0.05) so they
move some choices, and the sizes (8-12 experts, top 2-3, over 16 tokens and 3-5 MoE layers) make
every expert chosen somewhere. Nemotron-H's fixture routes in groups (2 of 3 groups of 4).

A routing choice within ~0.005 of a tie at one of the quantization gate's six steps is flipped
by int8 noise and moves the logits by far more than the gate's bound (Nemotron-H's seed 9: a
0.0009 gap at step 1, int8keepproj 0.84 of the logit scale, 0.02 at seed 11, whose smallest gap
there is 0.013; random routers have such near-ties at most seeds). The gate has no notion of a
routing near-tie, so the MoE fixtures' seeds are ones without one at the gate's steps.
Hidden sizes are multiples of 32 so that int8 quantizes the experts' gate/up and down."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

import hybrid_files as hf


@dataclass(frozen=True)
class Lfm2MoeDims:
    vocab: int = 96
    hidden: int = 64
    layer_types: tuple[str, ...] = ("conv", "full_attention", "conv", "conv", "full_attention")
    heads: int = 4  # head_dim 16
    kv_heads: int = 2
    ffn: int = 96  # the dense layers' SwiGLU
    dense_layers: int = 1
    experts: int = 8
    top_k: int = 2
    moe_ffn: int = 32
    expert_bias: bool = True
    norm_topk: bool = True
    scaling: float = 1.5


def _expert_scales(model: torch.nn.Module, seed: int) -> None:
    """Fan-in scales for the 3-D expert stacks [E, out, in]; a small random expert bias."""
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 3 and ".experts." in name:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
        for name, buf in model.named_buffers():
            if name.endswith(("expert_bias", "e_score_correction_bias")):
                buf.copy_(torch.randn(buf.shape, generator=g) * 0.05)


def write_lfm2_moe(folder: Path, d: Lfm2MoeDims = Lfm2MoeDims(), seed: int = 0) -> Path:
    """An `Lfm2MoeForCausalLM` folder, as save_pretrained writes it: one tensor per expert."""
    from transformers import Lfm2MoeConfig, Lfm2MoeForCausalLM

    config = Lfm2MoeConfig(
        vocab_size=d.vocab, hidden_size=d.hidden, intermediate_size=d.ffn, moe_intermediate_size=d.moe_ffn,
        num_hidden_layers=len(d.layer_types), layer_types=list(d.layer_types), num_attention_heads=d.heads,
        num_key_value_heads=d.kv_heads, num_dense_layers=d.dense_layers, num_experts=d.experts,
        num_experts_per_tok=d.top_k, use_expert_bias=d.expert_bias, norm_topk_prob=d.norm_topk,
        routed_scaling_factor=d.scaling, max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Lfm2MoeForCausalLM(config).eval()
    hf._fill_trained_like(model, seed)
    _expert_scales(model, seed)
    return hf._save(model, folder, family="lfm2")


@torch.no_grad()
def routed_experts(folder: Path, tokens: list[int], router_class: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """transformers' routing of `tokens` (one full-sequence forward): per MoE layer in order,
    (chosen experts [T, k] as its router returns them, the scores the choice ranked [T, E])."""
    model = hf.load_transformers(folder)
    found = []

    def keep(module, args, out):
        scores = out[0].sigmoid() if module.__class__.__name__.startswith(("Lfm2", "NemotronH")) else out[0].softmax(-1)
        bias = getattr(module, "_bias", None)
        found.append((out[2].clone(), scores + bias if bias is not None else scores))

    hooks = []
    for name, module in model.named_modules():
        if type(module).__name__ == router_class:
            parent = model.get_submodule(name.rsplit(".", 1)[0])
            # LFM2-MoE's bias is its MoE block's (when used); Nemotron-H's the router's own. A
            # grouped router's scores are returned unmasked: only the k-th/(k+1)-th tie is screened.
            module._bias = getattr(parent, "expert_bias", None) if getattr(parent, "use_expert_bias", False) else None
            module._bias = getattr(module, "e_score_correction_bias", module._bias)
            hooks.append(module.register_forward_hook(keep))
    model(torch.tensor([tokens]), use_cache=False)
    for h in hooks:
        h.remove()
    return found


@dataclass(frozen=True)
class Qwen35MoeDims:
    experts: int = 8
    top_k: int = 2
    moe_ffn: int = 32
    shared_ffn: int = 48


def write_qwen35_moe(folder: Path, d: Qwen35MoeDims = Qwen35MoeDims(), seed: int = 0) -> Path:
    """A `Qwen3_5MoeForCausalLM` folder (`qwen3_5_moe_text`) on Qwen3.5's tiny non-square layers
    (hybrid_files.Qwen35Dims, hidden 64), as save_pretrained writes it: one tensor per expert."""
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    text = hf._qwen35_text_config(hf.Qwen35Dims(hidden=64))
    text.pop("intermediate_size")
    config = Qwen3_5MoeTextConfig(**text, num_experts=d.experts, num_experts_per_tok=d.top_k,
                                  moe_intermediate_size=d.moe_ffn, shared_expert_intermediate_size=d.shared_ffn)  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen3_5MoeForCausalLM(config).eval()
    hf._fill_trained_like(model, seed)
    _expert_scales(model, seed)
    return hf._save(model, folder, family="qwen3_5")


@dataclass(frozen=True)
class NemotronMoeDims:
    pattern: str = "M*E-EME"  # M Mamba-2, * attention, - MLP, E MoE
    experts: int = 12
    top_k: int = 3
    groups: int = 3  # n_group: 3 groups of 4 experts
    top_groups: int = 2  # topk_group
    moe_ffn: int = 32
    shared_ffn: int = 48
    scaling: float = 2.5


def write_nemotron_moe(folder: Path, d: NemotronMoeDims = NemotronMoeDims(), seed: int = 0) -> Path:
    """A `NemotronHForCausalLM` folder with MoE layers (Nemotron-3 Nano's kind) on Nemotron-H's
    tiny non-square layers (hybrid_files.NemotronDims, hidden 64), `backbone.*` and one tensor per
    expert as released, the layer stack as `hybrid_override_pattern`."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    n = hf.NemotronDims(hidden=64, pattern=d.pattern, ffn=96, mamba_heads=8, mamba_head_dim=16)
    config = NemotronHConfig(
        vocab_size=n.vocab, hidden_size=n.hidden, hybrid_override_pattern=n.pattern, num_attention_heads=n.heads,
        num_key_value_heads=n.kv_heads, head_dim=n.head_dim, intermediate_size=n.ffn, mamba_num_heads=n.mamba_heads,
        mamba_head_dim=n.mamba_head_dim, n_groups=n.groups, ssm_state_size=n.state, conv_kernel=n.conv,
        use_conv_bias=True, layer_norm_epsilon=n.eps, tie_word_embeddings=False, max_position_embeddings=256,
        n_routed_experts=d.experts, num_experts_per_tok=d.top_k, moe_intermediate_size=d.moe_ffn,
        moe_shared_expert_intermediate_size=d.shared_ffn, n_group=d.groups, topk_group=d.top_groups,
        routed_scaling_factor=d.scaling, norm_topk_prob=True,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = NemotronHForCausalLM(config).eval()
    hf._fill_trained_like(model, seed)
    _expert_scales(model, seed)

    def edit(c):
        c.pop("layers_block_type")
        c["hybrid_override_pattern"] = d.pattern
        c["num_hidden_layers"] = len(d.pattern)

    return hf._save(model, folder, edit, family="nemotron_h")


@dataclass(frozen=True)
class GraniteMoeDims:
    experts: int = 8
    top_k: int = 2
    moe_ffn: int = 32
    shared_ffn: int = 48


def write_granite_moe(folder: Path, d: GraniteMoeDims = GraniteMoeDims(), seed: int = 0) -> Path:
    """A `GraniteMoeHybridForCausalLM` folder with routed experts in every layer (Granite-4.0-H-Tiny's
    kind) on Granite-4.0-H's tiny layers and multipliers (hybrid_files.GraniteDims, hidden 64),
    the experts stacked (`input_linear` / `output_linear`) as released."""
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    g = hf.GraniteDims(hidden=64, mamba_heads=8, mamba_head_dim=16, tied=False)
    config = GraniteMoeHybridConfig(
        vocab_size=g.vocab, hidden_size=g.hidden, intermediate_size=d.moe_ffn, shared_intermediate_size=d.shared_ffn,
        num_hidden_layers=len(g.layer_types), layer_types=list(g.layer_types), num_attention_heads=g.heads,
        num_key_value_heads=g.kv_heads, num_local_experts=d.experts, num_experts_per_tok=d.top_k,
        mamba_n_heads=g.mamba_heads, mamba_d_head=g.mamba_head_dim, mamba_n_groups=g.groups, mamba_d_state=g.state,
        mamba_d_conv=g.conv, mamba_expand=g.mamba_heads * g.mamba_head_dim // g.hidden, rms_norm_eps=g.eps,
        tie_word_embeddings=g.tied, max_position_embeddings=256, **g.multipliers,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = GraniteMoeHybridForCausalLM(config).eval()
    hf._fill_trained_like(model, seed)
    _expert_scales(model, seed)
    return hf._save(model, folder, family="granite")
