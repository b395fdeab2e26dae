"""Tiny Mamba-2 checkpoints written by the tests, in the real on-disk formats.

Deliberately independent of ssmport's own tables: the key names, shapes and config keys below
are written out again from transformers' `Mamba2ForCausalLM` / `Mamba2Config` and mamba_ssm's
`MambaLMHeadModel` / `MambaConfig`, so a mistake in ssmport's mapping cannot be mirrored here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file


@dataclass(frozen=True)
class Geometry:
    vocab: int = 160
    width: int = 64
    layers: int = 2
    heads: int = 4  # H != P != N so a transposed state cannot pass
    head_dim: int = 32
    state: int = 24
    groups: int = 2
    conv: int = 4
    conv_bias: bool = True
    bias: bool = False

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.inner + 2 * self.groups * self.state


def mixer_tensors(g: Geometry, seed: int, prefix: str = "backbone.") -> dict[str, torch.Tensor]:
    """Every tensor of a Mamba-2 LM except the head, trained-like value ranges."""
    gen = torch.Generator().manual_seed(seed)

    def rn(*shape, std=1.0, mean=0.0):
        return mean + std * torch.randn(*shape, generator=gen)

    d, inner = g.width, g.inner
    proj = 2 * inner + 2 * g.groups * g.state + g.heads
    t = {f"{prefix}embeddings.weight": rn(g.vocab, d), f"{prefix}norm_f.weight": rn(d, std=0.1, mean=1)}
    for i in range(g.layers):
        b = f"{prefix}layers.{i}."
        t[b + "norm.weight"] = rn(d, std=0.1, mean=1)
        t[b + "mixer.in_proj.weight"] = rn(proj, d, std=1 / math.sqrt(d))
        t[b + "mixer.conv1d.weight"] = rn(g.conv_dim, 1, g.conv, std=0.5)
        if g.conv_bias:
            t[b + "mixer.conv1d.bias"] = rn(g.conv_dim, std=0.1)
        t[b + "mixer.dt_bias"] = rn(g.heads, std=0.5, mean=-2.5)  # softplus -> ~0.08
        t[b + "mixer.A_log"] = torch.log(torch.linspace(1, 16, g.heads))
        t[b + "mixer.D"] = rn(g.heads, std=0.1, mean=1)
        t[b + "mixer.norm.weight"] = rn(inner, std=0.1, mean=1)
        t[b + "mixer.out_proj.weight"] = rn(d, inner, std=1 / math.sqrt(inner))
        if g.bias:
            t[b + "mixer.in_proj.bias"] = rn(proj, std=0.1)
            t[b + "mixer.out_proj.bias"] = rn(d, std=0.1)
    return t


def transformers_config(g: Geometry, tied: bool, **extra) -> dict:
    return {
        "model_type": "mamba2",
        "architectures": ["Mamba2ForCausalLM"],
        "vocab_size": g.vocab,
        "hidden_size": g.width,
        "num_hidden_layers": g.layers,
        "num_heads": g.heads,
        "head_dim": g.head_dim,
        "state_size": g.state,
        "n_groups": g.groups,
        "expand": g.inner // g.width,
        "conv_kernel": g.conv,
        "use_conv_bias": g.conv_bias,
        "use_bias": g.bias,
        "hidden_act": "silu",
        "layer_norm_epsilon": 1e-5,
        "residual_in_fp32": True,
        "time_step_limit": [0.0, {"__float__": "Infinity"}],  # how transformers 5 writes inf
        "tie_word_embeddings": tied,
        **extra,
    }


def write_transformers_folder(folder: Path, g: Geometry, seed: int, tied: bool, shards: int = 1, **extra) -> Path:
    """A `Mamba2ForCausalLM` folder: config.json + safetensors (a tied head is left out)."""
    tensors = mixer_tensors(g, seed)
    if not tied:
        tensors["lm_head.weight"] = torch.randn(g.vocab, g.width, generator=torch.Generator().manual_seed(seed + 1)) / 4
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(transformers_config(g, tied, **extra), indent=2))
    names = sorted(tensors)
    per = math.ceil(len(names) / shards)
    weight_map = {}
    for s in range(shards):
        fname = "model.safetensors" if shards == 1 else f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        chunk = {n: tensors[n].contiguous() for n in names[s * per : (s + 1) * per]}
        save_file(chunk, str(folder / fname))
        weight_map |= {n: fname for n in chunk}
    if shards > 1:
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def write_mamba_ssm_folder(folder: Path, g: Geometry, seed: int, vocab_unpadded: int) -> Path:
    """A state-spaces style folder: mamba_ssm's config.json and a pytorch_model.bin whose
    embedding is `backbone.embedding.weight` and which stores the tied head too."""
    assert g.groups and not g.bias
    tensors = {k.replace("backbone.embeddings.", "backbone.embedding."): v
               for k, v in mixer_tensors(g, seed).items()}  # fmt: skip
    tensors["lm_head.weight"] = tensors["backbone.embedding.weight"]
    config = {
        "d_model": g.width,
        "d_intermediate": 0,
        "n_layer": g.layers,
        "vocab_size": vocab_unpadded,
        "ssm_cfg": {"layer": "Mamba2", "d_state": g.state, "d_conv": g.conv, "expand": g.inner // g.width,
                    "headdim": g.head_dim, "ngroups": g.groups, "conv_bias": g.conv_bias},
        "attn_layer_idx": [],
        "attn_cfg": {},
        "rms_norm": True,
        "residual_in_fp32": True,
        "fused_add_norm": True,
        "pad_vocab_size_multiple": 16,
        "tie_embeddings": True,
    }  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    torch.save(tensors, folder / "pytorch_model.bin")
    return folder


def transformers_logits(folder: Path, tokens: list[int]) -> torch.Tensor:
    """fp32 logits of transformers' own Mamba2ForCausalLM (its pure-torch path, CPU) for the
    whole sequence in one forward: the chunked scan, independent of any step form."""
    from transformers import Mamba2ForCausalLM

    model = Mamba2ForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([tokens]), use_cache=False).logits[0].float()


def transformers_step_logits(folder: Path, tokens: list[int]):
    """Token-by-token with transformers' cache (its selective_state_update path): per-step
    logits and the final cache."""
    from transformers import Mamba2ForCausalLM

    model = Mamba2ForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    cache, rows = None, []
    with torch.no_grad():
        for t in tokens:
            out = model(torch.tensor([[t]]), cache_params=cache, use_cache=True)
            cache = out.cache_params
            rows.append(out.logits[0, -1].float())
    return torch.stack(rows), cache
