"""coreai-torch's `GatedDeltaUpdate` composite vs ssmport's plain ops, for one decode step.

L layers of the gated delta rule alone (inputs q, k, v, g, beta given; the stacked recState
[L, 1, HV, dk, dv] read per layer and written once), converted three ways:

  plain        ssmport.architectures.gated_deltanet.delta_rule_step (batched matmuls)
  composite    GatedDeltaUpdate traced as it is (a while_loop over the one token)
  externalized GatedDeltaUpdate emitted as a `gated_delta_update` composite graph

Prints, per variant, whether it converts, lowers and runs, ms per call on the Linux Core AI
runtime, and max |Δ| of the new state against the plain variant. Defaults: the
gated-deltanet-1.3b geometry (HV 6, dk 256, dv 512), 21 layers.

    python benchmarks/gdn_composite.py [--layers 21] [--calls 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch

import ssmport  # noqa: F401  (silences coreai-torch's version warning)
from ssmport.architectures.gated_deltanet import delta_rule_step
from ssmport.state import read_layer_by_matmul, write_once

INPUTS = ("q", "k", "v", "g", "beta")


class Recurrence(torch.nn.Module):
    def __init__(self, variant: str, layers: int, hv: int, dk: int, dv: int):
        super().__init__()
        from coreai_torch.composite_ops import GatedDeltaUpdate

        self.variant, self.layers = variant, layers
        self.gdu = GatedDeltaUpdate(use_qk_l2_norm=False)
        self.register_buffer("recState", torch.zeros(layers, 1, hv, dk, dv))

    def forward(self, q, k, v, g, beta):  # q, k [HV, dk] normalised; v [HV, dv]; g, beta [HV]
        HV, dk = q.shape
        outs, states = [], []
        for i in range(self.layers):
            S = read_layer_by_matmul(self.recState, i)[0]  # [HV, dk, dv], as the decode module reads it
            if self.variant == "plain":
                o, S = delta_rule_step(S, q * dk**-0.5, k, v, beta.view(HV, 1, 1), torch.exp(g).view(HV, 1, 1))
            else:  # the composite takes [B, H, S, D] and scales q itself
                o, S = self.gdu(q.view(1, HV, 1, dk), k.view(1, HV, 1, dk), v.view(1, HV, 1, -1),
                                g.view(1, HV, 1), beta.view(1, HV, 1), S.unsqueeze(0))  # fmt: skip
                o, S = o.reshape(HV, -1), S[0]
            outs.append(o)
            states.append(S)
        write_once(self.recState, states)
        return torch.stack(outs).sum(0)


def convert(variant: str, module: torch.nn.Module, example):
    import coreai_torch
    from coreai_torch import TorchConverter
    from coreai_torch.externalize import ExternalizeSpec

    decomp = lambda m: torch.export.export(m, example).run_decompositions(coreai_torch.get_decomp_table())  # noqa: E731
    names = dict(input_names=list(INPUTS), output_names=["o"], state_names=["recState"])
    conv = TorchConverter(mode=TorchConverter.Mode.RELEASE)
    with contextlib.redirect_stdout(io.StringIO()):
        if variant == "externalized":
            from coreai_torch.composite_ops import GatedDeltaUpdate

            spec = ExternalizeSpec(GatedDeltaUpdate, composite_op_name="gated_delta_update")
            conv.add_pytorch_module(module, export_fn=decomp, externalize_modules=[spec], **names)
        else:
            conv.add_exported_program(decomp(module), **names)
        return conv.to_coreai()


def run(variant: str, layers: int, hv: int, dk: int, dv: int, calls: int, seed: int = 0):
    from coreai.runtime import AIModel, NDArray

    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(hv, dk, generator=g), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(hv, dk, generator=g), dim=-1)
    example = (q, k, torch.randn(hv, dv, generator=g), -torch.rand(hv, generator=g), torch.rand(hv, generator=g))
    start = time.perf_counter()
    program = convert(variant, Recurrence(variant, layers, hv, dk, dv).eval(), example)
    convert_s = time.perf_counter() - start
    ir = str(program)
    with tempfile.TemporaryDirectory() as tmp:
        asset = program.save_asset(Path(tmp) / "m.aimodel")
        lowered = Path(tmp) / "m.aimodelx"
        lowered.mkdir()
        asset._write_odix(lowered)
        loop = asyncio.new_event_loop()
        model = loop.run_until_complete(AIModel.load(lowered))
        fn = model.load_function("main")
        state = {"recState": NDArray(np.zeros((layers, 1, hv, dk, dv), np.float32))}
        feeds = {n: NDArray(t.numpy()) for n, t in zip(INPUTS, example)}
        for _ in range(3):  # warm-up, and a state that has seen three tokens
            loop.run_until_complete(fn(inputs=feeds, state=state))
        after_three = state["recState"].numpy().copy()
        start = time.perf_counter()
        for _ in range(calls):
            loop.run_until_complete(fn(inputs=feeds, state=state))
        ms = 1000 * (time.perf_counter() - start) / calls
        del fn, model
        loop.close()
    info = {"convert_s": convert_s, "ms": ms, "composite_graphs": ir.count("composite_decl"),
            "while_ops": ir.count("coreai.while"), "writes": ir.count("coreai.write_handle")}  # fmt: skip
    return after_three, info


def main() -> None:
    warnings.simplefilter("ignore", FutureWarning)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=21)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--dk", type=int, default=256)
    p.add_argument("--dv", type=int, default=512)
    p.add_argument("--calls", type=int, default=20)
    a = p.parse_args()
    print(f"gated delta rule, {a.layers} layers x HV {a.heads}, dk {a.dk}, dv {a.dv}, fp32, {a.calls} calls")
    reference = None
    for variant in ("plain", "composite", "externalized"):
        try:
            state, info = run(variant, a.layers, a.heads, a.dk, a.dv, a.calls)
        except Exception as exc:  # report and go on: whether it converts is the question
            last = traceback.format_exception_only(exc)[-1].strip()
            print(f"  {variant:12} FAILED: {last[:300]}")
            continue
        reference = state if reference is None else reference
        assert np.abs(state).max() > 0, "the state was not written"
        delta = float(np.abs(state - reference).max())
        print(f"  {variant:12} {info['ms']:8.2f} ms/call  convert {info['convert_s']:5.1f} s  "
              f"composite graphs {info['composite_graphs']}  while ops {info['while_ops']}  "
              f"state writes {info['writes']}  max|Δstate| vs plain {delta:.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
