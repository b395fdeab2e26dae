"""A new architecture added from outside the package works with every command.

Runs in a fresh interpreter so registering does not leak into other tests.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

PLUGIN = textwrap.dedent(
    '''
    """toyrnn: a gated diagonal RNN, defined entirely outside ssmport."""
    from dataclasses import asdict, dataclass

    import torch
    import torch.nn.functional as F
    from torch import nn

    import ssmport
    from ssmport.checkpoint import DictSource
    from ssmport.state import StateSpec, register_states, write_once


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
        def __init__(self, c, src, b, state_dtype):
            super().__init__()
            self.emb = b.table("emb", src["emb"], "embedding")
            self.w = nn.ModuleList(b.matmul(f"l{i}.w", src[f"l{i}.w"].t(), "state_proj") for i in range(c.layers))
            self.decay = nn.ParameterList(b.vector(f"l{i}.decay", src[f"l{i}.decay"], "mix") for i in range(c.layers))
            self.out = b.matmul("out", src["out"].t(), "head", out_dtype=b.recipe.logits_dtype)
            self.vocab = c.vocab_size
            register_states(self, TOY.state_specs(c, state_dtype))

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
        def config_from_json(self, data):
            return ToyConfig(**data)

        def matches_pth(self, source):
            return "l0.decay" in source

        def load_pth(self, source):
            raise NotImplementedError

        def load_hf(self, config_json, source):
            raise NotImplementedError

        def synthetic_weights(self, c, seed):
            g = torch.Generator().manual_seed(seed)
            return DictSource({k: torch.randn(s, generator=g) / (s[-1] ** 0.5 if len(s) == 2 else 1)
                               for k, s in shapes(c).items()})

        def state_specs(self, c, state_dtype):
            return [StateSpec("h", (c.layers, 1, c.width), state_dtype, "[layer, batch, width]")]

        def build_decode(self, c, weights, builder, state_dtype):
            return ToyDecode(c, weights, builder, state_dtype)

        def reference(self, c, weights):
            return ToyReference(c, weights)

        def keeps_float(self, name):
            return name != "out"


    TOY = Toy(
        name="toyrnn",
        description="gated diagonal RNN (test plugin)",
        presets=(ssmport.Preset("toyrnn-tiny", "toyrnn", {"vocab_size": 96, "width": 64, "layers": 2},
                                "plugin test model", released=False),),
    )
    ssmport.register_architecture(TOY)
    '''
)

DRIVER = textwrap.dedent(
    """
    import sys, json
    sys.path.insert(0, sys.argv[1])
    import toyrnn  # registers the architecture
    import ssmport
    from ssmport.cli.main import main

    out = sys.argv[2]
    assert "toyrnn-tiny" in ssmport.presets()
    result = ssmport.export("toyrnn-tiny", out, quant="fp32", gate_steps=10, progress=False)
    assert result.manifest["gate"]["passed"], result.manifest["gate"]
    assert [s["name"] for s in result.manifest["states"]] == ["h"]
    assert main(["gate", str(result.path), "--prompts", "2", "--steps", "6"]) == 0
    i8 = ssmport.export("toyrnn-tiny", out, quant="int8keepproj", gate_steps=6, progress=False)
    kinds = {e["name"]: e["dtype"] for e in i8.manifest["plan"]["tensors"]}
    assert kinds["out"] == "int8" and kinds["l0.w"] == "float16", kinds
    assert i8.manifest["gate"]["passed"]
    print("plugin ok")
    """
)


def test_external_architecture_end_to_end(tmp_path):
    (tmp_path / "toyrnn.py").write_text(PLUGIN)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    proc = subprocess.run(
        [sys.executable, str(driver), str(tmp_path), str(tmp_path / "out")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "plugin ok" in proc.stdout
