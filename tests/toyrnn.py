"""toyrnn: a gated diagonal RNN written against ssmport's public API only, as a plugin would be.

Not registered here: `toyrnn_plugin.py` registers it (in a subprocess, or via --plugin), and
the contract-helper tests build broken variants of it without touching the registry.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

import ssmport
from ssmport.loader.checkpoint import DictSource, MappedSource, check_strict
from ssmport.ops.rows import write_once
from ssmport.state import StateSpec, register_states


@dataclass(frozen=True)
class ToyConfig:
    vocab_size: int
    width: int
    layers: int

    def to_json(self):
        return asdict(self)


def shapes(c):
    s = {"emb": (c.vocab_size, c.width), "out": (c.vocab_size, c.width)}
    for i in range(c.layers):
        s |= {f"l{i}.w": (c.width, c.width), f"l{i}.decay": (c.width,)}
    return s


class ToyDecode(nn.Module):
    def __init__(self, arch, c, src, b, state_dtype):
        super().__init__()
        self.emb = b.table("emb", src["emb"], "embedding")
        self.w = nn.ModuleList(b.matmul(f"l{i}.w", src[f"l{i}.w"].t(), "state_proj") for i in range(c.layers))
        self.decay = nn.ParameterList(b.vector(f"l{i}.decay", src[f"l{i}.decay"], "mix") for i in range(c.layers))
        self.out = b.matmul("out", src["out"].t(), "head", out_dtype=b.recipe.logits_dtype)
        self.vocab = c.vocab_size
        register_states(self, arch.state_specs(c, state_dtype))

    def forward(self, input_ids, position_ids):
        x = F.embedding(input_ids.view(1), self.emb).float()
        new = []
        for i, w in enumerate(self.w):
            a = torch.sigmoid(self.decay[i])
            h = a * self.h[i].float() + (1 - a) * torch.tanh(w(x))
            new.append(h)
            x = x + h
        write_once(self.h, new)
        return self.out(x).view(1, 1, self.vocab)


class ToyReference:
    def __init__(self, c, weights):
        self.c, self.w = c, {k: weights[k].float() for k in shapes(c)}

    def zero_state(self):
        return [torch.zeros(self.c.width) for _ in range(self.c.layers)]

    def step(self, token, state):
        x = self.w["emb"][token]
        for i in range(self.c.layers):
            a = torch.sigmoid(self.w[f"l{i}.decay"])
            state[i] = a * state[i] + (1 - a) * torch.tanh(self.w[f"l{i}.w"] @ x)
            x = x + state[i]
        return self.w["out"] @ x


class Toy(ssmport.Architecture):
    """Loads `.pth` files of its canonical names (matches_pth/load_pth); no HF loader, so
    the base class's one-line error answers for HF folders."""

    def config_from_json(self, data):
        return ToyConfig(**data)

    def matches_pth(self, source):
        return "l0.decay" in source

    def load_pth(self, source):
        c = ToyConfig(*source.shape("emb"), layers=sum(n.endswith(".decay") for n in source))
        check_strict(source, shapes(c), what="toyrnn")
        return c, MappedSource(source, {n: (n, torch.Tensor.float) for n in shapes(c)}, shapes(c))

    def synthetic_weights(self, c, seed):
        g = torch.Generator().manual_seed(seed)
        return DictSource({k: torch.randn(s, generator=g) / (s[-1] ** 0.5 if len(s) == 2 else 1)
                           for k, s in shapes(c).items()})  # fmt: skip

    def state_specs(self, c, state_dtype):
        return [StateSpec("h", (c.layers, 1, c.width), state_dtype, "[layer, batch, width]")]

    def build_decode(self, c, weights, builder, state_dtype):
        return ToyDecode(self, c, weights, builder, state_dtype)

    def reference(self, c, weights):
        return ToyReference(c, weights)

    def keeps_float(self, name):
        return name != "out"


TINY = {"vocab_size": 96, "width": 64, "layers": 2}


def make_toy(name: str = "toyrnn", cls: type[Toy] = Toy) -> Toy:
    return cls(
        name=name,
        description="gated diagonal RNN (test plugin)",
        presets=(ssmport.Preset(f"{name}-tiny", name, TINY, "plugin test model", released=False),),
        tiny_preset=f"{name}-tiny",
    )
