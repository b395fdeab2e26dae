"""How far fp32 itself is from the truth: the RWKV-7 reference loop in fp32 vs fp64, per layer.

The fp32 gate compares the Core AI bundle with the fp32 torch module; its limit only makes
sense above the model's own fp32 rounding floor. This runs the plain reference
(`RWKV7Reference`) layer by layer over all tokens (the recurrence is causal per layer), in
fp32 and in fp64 from the same fp32 weights, so only one layer is in memory at a time (a
1.5B model runs in ~2 GB). Per layer it prints the residual stream's relative fp32 error
(chained from layer 0, and local: this layer's fp32 fed the fp64 input) and, from the fp64
run, the smallest ln_x input variance var(y) in units of ln_x_eps at step 0 and later, and
the same two errors for the fp32 export-form layers (`_Layer`, what the gate's torch side
runs). Finally max |Δlogits| per step of both fp32 forms vs fp64, relative to the logit
scale like the gate (the export form's logits use the plain fp32 head here).

    flock /tmp/ssmport-heavy.lock python benchmarks/fp32_noise_floor.py rwkv7-1.5b --steps 8
    python benchmarks/fp32_noise_floor.py rwkv7-0.1b --layers 24   # 0.1B width, 24 layers
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses

import numpy as np
import torch
import torch.nn.functional as F

from ssmport.graph import Step
from ssmport.models.rwkv7 import RWKV7
from ssmport.models.rwkv7.block import REC_STATE, SHIFT_STATE, RWKV7Block
from ssmport.models.rwkv7.checkpoints import canonical_shapes
from ssmport.models.rwkv7.reference import RWKV7Reference
from ssmport.models.rwkv7.synthetic import synthetic_init
from ssmport.ops.deferred import apply_naive
from ssmport.loader.checkpoint import GeneratedSource
from ssmport.gate.report import default_prompts
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.loader.resolve import load_model
from ssmport.tokenizers import load_tokenizer


@contextlib.contextmanager
def recording_ln_x_variances(eps: float, out: list[float]):
    """The reference's only torch.sqrt is ln_x's sqrt(var + eps): record var."""
    sqrt = torch.sqrt

    def rec(x):
        out.append(float(x) - eps)
        return sqrt(x)

    torch.sqrt = rec
    try:
        yield
    finally:
        torch.sqrt = sqrt


def layer_reference(cfg, weights, i: int, dtype: torch.dtype) -> RWKV7Reference:
    ref = RWKV7Reference.__new__(RWKV7Reference)  # one layer's weights only
    ref.cfg = cfg
    ref.w = {n: weights[n].to(dtype) for n in canonical_shapes(cfg) if n.startswith(f"blocks.{i}.")}
    ref.att = {i: {n.removeprefix(f"blocks.{i}.att."): t for n, t in ref.w.items() if ".att." in n}}
    return ref


def run_layer(ref, i, xs, dtype, v_firsts):
    """Block i of the reference step over every token: new residuals and v_first per token."""
    c, w, p = ref.cfg, ref.w, f"blocks.{i}."
    torch.set_default_dtype(dtype)  # the reference allocates its per-head output buffer
    state = {
        "wkv": {i: torch.zeros(c.num_heads, c.v_head, c.head_size)},
        "att_x": {i: torch.zeros(c.hidden_size)},
        "ffn_x": {i: torch.zeros(c.hidden_size)},
    }
    outs, vfs = [], []
    try:
        for t, x in enumerate(xs):
            h = F.layer_norm(x, (c.hidden_size,), w[p + "ln1.weight"], w[p + "ln1.bias"], c.norm_eps)
            att, vf = ref._time_mix(i, h, state, None if v_firsts is None else v_firsts[t])
            x = x + att
            h = F.layer_norm(x, (c.hidden_size,), w[p + "ln2.weight"], w[p + "ln2.bias"], c.norm_eps)
            outs.append(x + ref._channel_mix(i, h, state))
            vfs.append(vf)
    finally:
        torch.set_default_dtype(torch.float32)
    return outs, vfs


def run_export_layer(cfg, weights, i, xs, v_firsts):
    """Block i of the fp32 export-form module (what the gate's torch side runs), token by token."""
    layer = RWKV7Block(cfg, i, weights, WeightBuilder(get_recipe("fp32"), RWKV7.keeps_float))
    rec = torch.zeros(cfg.num_heads, cfg.head_size, cfg.v_head)
    shift = torch.zeros(2, cfg.hidden_size)
    outs, vfs = [], []
    with torch.no_grad():
        for t, x in enumerate(xs):
            x = x.float().view(1, -1)
            step = Step(None, torch.tensor([t], dtype=torch.int32))
            if v_firsts is not None:
                step.carry["v_first"] = v_firsts[t].float().view(1, -1)
            x, new = layer(x, {REC_STATE: rec, SHIFT_STATE: shift}, step)
            update = new[REC_STATE]
            rec = apply_naive(rec.view(update.view), update).view(rec.shape)
            shift = torch.cat(new[SHIFT_STATE])
            outs.append(x.view(-1))
            vfs.append(step.carry["v_first"].view(-1))
    return outs, vfs


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).norm() / b.norm())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--layers", type=int, help="override the preset's depth (same synthetic weights per layer)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ln-x-eps", type=float, help="override ln_x's eps (to test its part in the floor)")
    args = ap.parse_args()
    torch.set_num_threads(1)

    model = load_model(args.preset, synthetic=True, seed=args.seed)
    cfg, W = model.config, model.weights
    if args.layers:
        cfg = dataclasses.replace(cfg, num_layers=args.layers)
        W = GeneratedSource(canonical_shapes(cfg), args.seed, synthetic_init)
    if args.ln_x_eps is not None:
        cfg = dataclasses.replace(cfg, ln_x_eps=args.ln_x_eps)
    tokens = default_prompts(cfg.vocab_size, 1, args.steps, tokenizer=load_tokenizer(model.vocab_path))[0]
    T = len(tokens)

    def ln0(x):
        return F.layer_norm(x, (cfg.hidden_size,), W["blocks.0.ln0.weight"].to(x.dtype),
                            W["blocks.0.ln0.bias"].to(x.dtype), cfg.norm_eps)  # fmt: skip

    emb = W["emb.weight"][tokens]
    x32, x64 = [ln0(e) for e in emb], [ln0(e.double()) for e in emb]
    xe, vf32, vf64, vfe = list(x32), None, None, None
    print(f"{args.preset} L={cfg.num_layers} C={cfg.hidden_size} H={cfg.num_heads} tokens {tokens}")
    print("layer  |x|@0   fp32 rel err @0 (chained, local)  min var(y)/eps @0 (heads <1)  later"
          "   export form rel err @0 (chained, local)")  # fmt: skip
    for i in range(cfg.num_layers):
        r32, r64 = layer_reference(cfg, W, i, torch.float32), layer_reference(cfg, W, i, torch.float64)
        variances: list[float] = []
        with recording_ln_x_variances(cfg.ln_x_eps, variances):
            n64, nvf64 = run_layer(r64, i, x64, torch.float64, vf64)
        v = np.array(variances).reshape(T, cfg.num_heads) / cfg.ln_x_eps
        local, _ = run_layer(r32, i, [x.float() for x in x64], torch.float32,
                             None if vf64 is None else [q.float() for q in vf64])  # fmt: skip
        n32, nvf32 = run_layer(r32, i, x32, torch.float32, vf32)
        ne, nvfe = run_export_layer(cfg, W, i, xe, vfe)
        local_e, _ = run_export_layer(cfg, W, i, x64, vf64)
        later = f"{v[1:].min():9.3g}" if T > 1 else ""
        print(f"{i:5d} {float(n64[0].norm()):6.1f}   {rel(n32[0], n64[0]):.2e}  {rel(local[0], n64[0]):.2e}"
              f"          {v[0].min():9.3g} ({int((v[0] < 1).sum())}/{cfg.num_heads})   {later}"
              f"   {rel(ne[0], n64[0]):.2e}  {rel(local_e[0], n64[0]):.2e}", flush=True)  # fmt: skip
        x32, x64, xe, vf32, vf64, vfe = n32, n64, ne, nvf32, nvf64, nvfe

    head, lw, lb = W["head.weight"], W["ln_out.weight"], W["ln_out.bias"]

    def logits(xs, dtype):
        h, w, b = head.to(dtype), lw.to(dtype), lb.to(dtype)
        return torch.stack([h @ F.layer_norm(x.to(dtype), (cfg.hidden_size,), w, b, cfg.norm_eps) for x in xs]).double()

    l64 = logits(x64, torch.float64)
    scale = max(1.0, float(l64.abs().max()))
    print(f"logit scale (fp64) {scale:.3g}")
    for label, xs in (("reference loop fp32", x32), ("export-form layers fp32 (plain head)", xe)):
        l32 = logits(xs, torch.float32)
        delta = (l32 - l64).abs().amax(1)
        print(f"{label} vs fp64: max |Δ| per step " + " ".join(f"{d:.2e}" for d in delta.tolist()))
        print(f"  max |Δ| {float(delta.max()):.3g} = {float(delta.max()) / scale:.2e} of scale; "
              f"top-1 agree {(l32.argmax(1) == l64.argmax(1)).tolist()}")  # fmt: skip


if __name__ == "__main__":
    main()
