"""coreai-torch's `GatedDeltaUpdate` composite vs ssmport's plain ops, for one decode step.

L layers of the gated delta rule alone (inputs q, k, v, g, beta given; the stacked recState
[L, 1, HV, dk, dv] read per layer and written once), converted three ways:

  plain        ssmport.ops.delta_rule.step (batched matmuls)
  composite    GatedDeltaUpdate traced as it is (a while_loop over the one token)
  externalized GatedDeltaUpdate emitted as a `gated_delta_update` composite graph

Prints, per variant, whether it converts, lowers and runs, ms per call on the Linux Core AI
runtime, and max |Δ| of the new state against the plain variant. Defaults: the
gated-deltanet-1.3b geometry (HV 6, dk 256, dv 512), 21 layers.

    python benchmarks/gdn_composite.py [--layers 21] [--calls 20]
    python benchmarks/gdn_composite.py --layers 4 --read gather --profile   # ops by time

`--read` picks how a layer's slice of the stacked state is read: `matmul` (what the decode
module does, `state.read_layer_by_matmul`) or `gather` (`state.read_layer`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import itertools
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch

import ssmport  # noqa: F401  (silences coreai-torch's version warning)
from ssmport.ops.delta_rule import step as delta_rule_step
from ssmport.ops.rows import read_layer, read_layer_by_matmul, write_once

INPUTS = ("q", "k", "v", "g", "beta")


class Recurrence(torch.nn.Module):
    def __init__(self, variant: str, layers: int, hv: int, dk: int, dv: int, read: str = "matmul"):
        super().__init__()
        self.read = read_layer_by_matmul if read == "matmul" else read_layer
        from coreai_torch.composite_ops import GatedDeltaUpdate

        self.variant, self.layers = variant, layers
        self.gdu = GatedDeltaUpdate(use_qk_l2_norm=False)
        self.register_buffer("recState", torch.zeros(layers, 1, hv, dk, dv))

    def forward(self, q, k, v, g, beta):  # q, k [HV, dk] normalised; v [HV, dv]; g, beta [HV]
        HV, dk = q.shape
        outs, states = [], []
        for i in range(self.layers):
            S = self.read(self.recState, i)[0]  # [HV, dk, dv]
            if self.variant == "plain":
                S, o = delta_rule_step(S, q * dk**-0.5, k, v, beta.view(HV, 1, 1), torch.exp(g).view(HV, 1, 1))
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


def op_profiler(totals: dict):
    """A runtime Profiler adding each op's wall time to totals[op name]."""
    from coreai.runtime import Profiler

    begins: dict[int, tuple[float, str]] = {}
    keys = itertools.count()

    def begin(event) -> int:
        key = next(keys)
        begins[key] = (time.perf_counter(), event.event_id)
        return key

    def end(event, key: int) -> None:
        start, name = begins.pop(key)
        totals[name] = totals.get(name, 0.0) + time.perf_counter() - start

    return Profiler(on_log_event_begin=begin, on_log_event_end=end)


def run(variant: str, layers: int, hv: int, dk: int, dv: int, calls: int, read: str = "matmul",
        profile: dict | None = None, seed: int = 0):
    from coreai.runtime import AIModel, NDArray

    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(hv, dk, generator=g), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(hv, dk, generator=g), dim=-1)
    example = (q, k, torch.randn(hv, dv, generator=g), -torch.rand(hv, generator=g), torch.rand(hv, generator=g))
    start = time.perf_counter()
    program = convert(variant, Recurrence(variant, layers, hv, dk, dv, read).eval(), example)
    convert_s = time.perf_counter() - start
    ir = str(program)
    with tempfile.TemporaryDirectory() as tmp:
        asset = program.save_asset(Path(tmp) / "m.aimodel")
        lowered = Path(tmp) / "m.aimodelx"
        lowered.mkdir()
        asset._write_odix(lowered)
        loop = asyncio.new_event_loop()
        model = loop.run_until_complete(AIModel.load(lowered))
        fn = model.load_function("main", profiler=op_profiler(profile)) if profile is not None else model.load_function("main")
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
    p.add_argument("--read", choices=("matmul", "gather"), default="matmul")
    p.add_argument("--profile", action="store_true", help="per-op times of the plain variant")
    a = p.parse_args()
    print(f"gated delta rule, {a.layers} layers x HV {a.heads}, dk {a.dk}, dv {a.dv}, fp32, {a.calls} calls, "
          f"{a.read} reads")
    if a.profile:
        totals: dict[str, float] = {}
        run("plain", a.layers, a.heads, a.dk, a.dv, a.calls, a.read, profile=totals)
        calls = a.calls + 3
        for name, seconds in sorted(totals.items(), key=lambda kv: -kv[1])[:10]:
            print(f"  {1000 * seconds / calls:8.2f} ms/call  {name}")
        return
    reference = None
    for variant in ("plain", "composite", "externalized"):
        try:
            state, info = run(variant, a.layers, a.heads, a.dk, a.dv, a.calls, a.read)
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
