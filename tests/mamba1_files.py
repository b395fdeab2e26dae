"""Tiny Mamba-1 / Falcon-Mamba checkpoints written by the tests, in the real on-disk formats.

The transformers folders are written by transformers itself (`MambaForCausalLM` /
`FalconMambaForCausalLM` built from a config, every parameter redrawn from a fixed seed so
no gain is 1 and no two channels share A, then `save_pretrained`); the mamba_ssm folder's
names and config keys are written out again from mamba_ssm's `MambaLMHeadModel` /
`MambaConfig`. Nothing here reads ssmport's own tables."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Geometry:
    vocab: int = 160
    width: int = 64  # a multiple of 32: int8 blocks of the head
    layers: int = 2
    expand: int = 2  # I = 128
    state: int = 12  # N != K so a transposed state cannot pass
    dt_rank: int | str = "auto"  # ceil(64 / 16) = 4
    conv: int = 4
    conv_bias: bool = True
    bias: bool = False
    falcon: bool = False
    tied: bool = True


MAMBA = Geometry()
FALCON = Geometry(dt_rank=5, conv=3, conv_bias=False, bias=True, falcon=True, tied=False)


def _config(g: Geometry):
    from transformers import FalconMambaConfig, MambaConfig

    cls = FalconMambaConfig if g.falcon else MambaConfig
    return cls(vocab_size=g.vocab, hidden_size=g.width, num_hidden_layers=g.layers, expand=g.expand, state_size=g.state,
               time_step_rank=g.dt_rank, conv_kernel=g.conv, use_conv_bias=g.conv_bias, use_bias=g.bias,
               tie_word_embeddings=g.tied, **({"mixer_rms_eps": 1e-5} if g.falcon else {}))  # fmt: skip


def _redraw(model, seed: int) -> None:
    """Trained-like values: A = 1..16 at random per entry, dt ~ softplus(bias) in [1e-3, 0.1],
    gains and D near 1, every matrix 1/sqrt(fan-in)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            r = torch.randn(p.shape, generator=gen)
            if name.endswith("A_log"):
                p.copy_(torch.log(1 + 15 * torch.rand(p.shape, generator=gen)))
            elif name.endswith("dt_proj.bias"):
                dt = torch.exp(torch.rand(p.shape, generator=gen) * math.log(100) + math.log(1e-3))
                p.copy_(dt + torch.log(-torch.expm1(-dt)))
            elif name.endswith(("norm.weight", "norm_f.weight", ".D")):
                p.copy_(1 + 0.1 * r)
            elif p.dim() == 1:
                p.copy_(0.1 * r)
            else:
                p.copy_(r / math.sqrt(p.shape[-1]))


def write_transformers_folder(folder: Path, g: Geometry, seed: int) -> Path:
    from transformers import FalconMambaForCausalLM, MambaForCausalLM

    torch.manual_seed(seed)
    model = (FalconMambaForCausalLM if g.falcon else MambaForCausalLM)(_config(g))
    _redraw(model, seed)
    model.save_pretrained(folder)
    return folder


def write_mamba_ssm_folder(folder: Path, hf_folder: Path, vocab_unpadded: int) -> Path:
    """The Mamba (not Falcon) weights of `hf_folder` in state-spaces' layout: mamba_ssm's config.json
    and a pytorch_model.bin whose table is `backbone.embedding.weight` and which stores the tied head."""
    from safetensors.torch import load_file

    cfg = json.loads((hf_folder / "config.json").read_text())
    tensors = {k.replace("backbone.embeddings.", "backbone.embedding."): v
               for k, v in load_file(hf_folder / "model.safetensors").items()}  # fmt: skip
    tensors["lm_head.weight"] = tensors["backbone.embedding.weight"]
    config = {"d_model": cfg["hidden_size"], "d_intermediate": 0, "n_layer": cfg["num_hidden_layers"],
              "vocab_size": vocab_unpadded, "ssm_cfg": {"d_state": cfg["state_size"]}, "attn_layer_idx": [], "attn_cfg": {}, "rms_norm": True,
              "residual_in_fp32": True, "fused_add_norm": True, "pad_vocab_size_multiple": 8, "tie_embeddings": True}  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    torch.save(tensors, folder / "pytorch_model.bin")
    return folder


def _model(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def transformers_logits(folder: Path, tokens: list[int]) -> torch.Tensor:
    """fp32 logits of transformers' own model (its pure-torch path, CPU) for the whole sequence
    in one forward: its sequential scan, independent of any step form."""
    with torch.no_grad():
        return _model(folder)(torch.tensor([tokens]), use_cache=False).logits[0].float()


def transformers_step_logits(folder: Path, tokens: list[int]):
    """Token by token with transformers' cache (its selective_state_update path): per-step
    logits and the final cache."""
    model, cache, rows = _model(folder), None, []
    with torch.no_grad():
        for t in tokens:
            out = model(torch.tensor([[t]]), cache=cache, use_cache=True)
            cache = out.cache
            rows.append(out.logits[0, -1].float())
    return torch.stack(rows), cache
