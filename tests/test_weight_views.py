"""A weight handed to the builder may be a view of a storage other weights share.

A plugin that slices its layers' weights out of one fused checkpoint tensor hands
`builder.matmul` / `builder.vector` views of one storage. Read from a bf16 `.pth`, that
storage is a fresh fp32 tensor the converter frees after copying a weight: before the
builder copied such views, the second view read freed memory (exit 139, no message).
fp32 `.pth` files (memory-mapped, never freed) and synthetic weights (kept) hide it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).parent

# The toy RNN (tests/toyrnn.py) with its per-layer weights fused into one tensor each:
# "w" [layers, in, out] and "decay" [layers, width]; the decode module takes views of them.
PLUGIN = textwrap.dedent(
    """
    import sys
    import torch
    from torch import nn

    import ssmport
    from ssmport.loader.checkpoint import DictSource, MappedSource, check_strict
    from ssmport.state import register_states

    sys.path.insert(0, {tests!r})
    from toyrnn import Toy, ToyConfig, ToyDecode, make_toy


    def shapes(c):
        return {{"emb": (c.vocab_size, c.width), "out": (c.vocab_size, c.width),
                 "w": (c.layers, c.width, c.width), "decay": (c.layers, c.width)}}


    class Decode(ToyDecode):  # the toy's forward, over weights that are views of one tensor each
        def __init__(self, arch, c, src, b, state_dtype):
            nn.Module.__init__(self)
            w, decay = src["w"], src["decay"]  # read once: every layer's weight is a view of them
            self.emb = b.table("emb", src["emb"], "embedding")
            self.w = nn.ModuleList(b.matmul(f"w.{{i}}", w[i], "state_proj") for i in range(c.layers))
            self.decay = nn.ParameterList(b.vector(f"decay.{{i}}", decay[i], "mix") for i in range(c.layers))
            self.out = b.matmul("out", src["out"].t(), "head", out_dtype=b.recipe.logits_dtype)
            self.vocab = c.vocab_size
            register_states(self, arch.state_specs(c, state_dtype))


    class Reference:
        def __init__(self, c, weights):
            self.c, self.w = c, {{k: weights[k].float() for k in shapes(c)}}

        def zero_state(self):
            return [torch.zeros(self.c.width) for _ in range(self.c.layers)]

        def step(self, token, state):
            x = self.w["emb"][token]
            for i in range(self.c.layers):
                a = torch.sigmoid(self.w["decay"][i])
                state[i] = a * state[i] + (1 - a) * torch.tanh(x @ self.w["w"][i])
                x = x + state[i]
            return self.w["out"] @ x


    class FusedToy(Toy):
        def matches_pth(self, source):
            return "w" in source and "decay" in source

        def load_pth(self, source):
            layers, width, _ = source.shape("w")
            c = ToyConfig(source.shape("emb")[0], width, layers)
            check_strict(source, shapes(c), what="fusedtoy")
            return c, MappedSource(source, {{n: (n, torch.Tensor.float) for n in shapes(c)}}, shapes(c))

        def synthetic_weights(self, c, seed):
            g = torch.Generator().manual_seed(seed)
            return DictSource({{k: torch.randn(s, generator=g) / s[-1] ** 0.5 for k, s in shapes(c).items()}})

        def build_decode(self, c, weights, builder, state_dtype):
            return Decode(self, c, weights, builder, state_dtype)

        def reference(self, c, weights):
            return Reference(c, weights)


    FUSED = ssmport.register_architecture(make_toy("fusedtoy", FusedToy))
    """
)

DRIVER = textwrap.dedent(
    """
    import sys
    import numpy as np
    import torch
    import ssmport
    from ssmport.cli.main import main
    from ssmport.plugins import load_plugin
    from ssmport.runtime import Runner
    from ssmport.testing import reference_logits, step_logits

    plugin, work = sys.argv[1], sys.argv[2]
    arch = load_plugin(plugin).FUSED
    config = arch.config_from_json({"vocab_size": 96, "width": 64, "layers": 3})
    weights = arch.synthetic_weights(config, 0)
    torch.save({n: weights[n].to(torch.bfloat16) for n in weights}, work + "/fused.pth")
    code = main(["--plugin", plugin, "export", work + "/fused.pth", "-o", work, "--quant", "fp32",
                 "--no-prefill", "--gate-steps", "4", "--name", "fused"])
    assert code == 0, code
    tokens = [3, 17, 17, 17, 90, 0, 41, 5]
    want = reference_logits(arch, ssmport.load_model(work + "/fused.pth"), tokens)
    with Runner(work + "/fused") as runner:
        got = step_logits(runner, tokens)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 1e-5 and (got.argmax(-1) == want.argmax(-1)).all(), err
    print(f"views ok {err:.1e}")
    """
)


def test_weights_that_are_views_of_one_bf16_tensor(tmp_path):
    plugin, driver = tmp_path / "fused_plugin.py", tmp_path / "driver.py"
    plugin.write_text(PLUGIN.format(tests=str(TESTS)))
    driver.write_text(DRIVER)
    proc = subprocess.run([sys.executable, driver, plugin, tmp_path], capture_output=True, text=True)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    assert "views ok" in proc.stdout
