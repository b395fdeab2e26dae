"""Why does int4keepproj miss its gate on the random-weight test fixtures? One tensor group at a time.

On the fixtures of tests/test_moe.py, tests/test_lfm3.py and tests/test_recurrent_gemma.py (same
writers, same seeds, the export gate's token stream: one stream of `--steps` tokens) this builds
the decode module with the recipe's own `WeightBuilder` (the values the bundle stores) and runs it
teacher-forced in torch with fp32 sums (`accumulation.accumulate_in_fp32`: the recipe's error,
not this runtime's fp16 sums), against the fp32 torch reference, and prints max |Δlogits| /
logit scale (the gate's measure) and top-1 agreement for:

  int4keepproj                   the recipe as it is
  its int4 tensors at int8       / at fp16: what the 4-bit tensors cost in all
  only group G int4              every other int4 tensor at int8
  all but group G int4           group G at int8
  routing replayed (MoE)         the quantized run routed as the reference routed (the experts'
                                 weights still from its own scores): the part routing flips carry

and, at the first step, each layer's update |out - in| / |in| and int4keepproj's relative error
on the residual after it; and both recipes with the token embedding table x4 and x12 (the
residual larger against the same layer updates, as Granite's embedding multiplier makes it).
`--weights`: the per-weight int4 error |deq(q(W)) - W| / |W| of the
fixture's matmuls next to the trained rwkv7-pydoc's, and rwkv7-pydoc's int8keepproj and
int4keepproj errors on 48 held-out bytes, trained and with its matmul weights shuffled.

    python benchmarks/int4_ablation.py lfm2_moe qwen3_5_moe nemotron_h granitemoehybrid lfm3 recurrent_gemma \\
        --weights --json benchmarks/results/int4_ablation.json
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from accumulation import accumulate_in_fp32, held_out_tokens, write_json  # noqa: E402
import ssmport.models.moe as moe  # noqa: E402
from ssmport.loader.checkpoint import DictSource  # noqa: E402
from ssmport.gate.report import default_prompts  # noqa: E402
from ssmport.quant import get_recipe  # noqa: E402
from ssmport.quant.blockwise import dequantize_blockwise, quantize_blockwise  # noqa: E402
from ssmport.quant.plan import WeightBuilder  # noqa: E402
from ssmport.loader.resolve import load_checkpoint, load_model  # noqa: E402
from ssmport.tokenizers import load_tokenizer  # noqa: E402
from ssmport.gate.torch_runner import TorchRunner  # noqa: E402


def _fixtures() -> dict:
    """The test files' fixture writers, with their seeds."""
    import lfm3_files
    import moe_files as mf
    import recurrent_gemma_files as rf

    return {
        "lfm2_moe": lambda f: mf.write_lfm2_moe(f, seed=7),
        "qwen3_5_moe": lambda f: mf.write_qwen35_moe(f, seed=8),
        "nemotron_h": lambda f: mf.write_nemotron_moe(f, seed=11),
        "granitemoehybrid": lambda f: mf.write_granite_moe(f, seed=10),
        "lfm3": lambda f: lfm3_files.write_lfm3(f, lfm3_files.Lfm3Dims(), seed=7),
        "recurrent_gemma": lambda f: rf.write(f, seed=3),
    }


class RoutingReplay:
    """Patches `moe.route`: "record" keeps the reference's choices; "replay" routes the next run
    as recorded (weights from that run's own scores at those experts) and counts the (layer,
    token) choices it would have made differently; "count" only counts them (the run routes
    freely)."""

    def __init__(self):
        self.mode, self.log, self.at, self.changed, self.calls = "off", [], 0, 0, 0
        self._route = moe.route
        moe.route = self.route

    def route(self, spec, logits, bias):
        chosen, weights = self._route(spec, logits, bias)
        if self.mode == "record":
            self.log.append(chosen.clone())
        elif self.mode in ("replay", "count"):
            ref = self.log[self.at]
            self.at += 1
            self.calls += 1
            self.changed += int((chosen.sort(-1).values != ref.sort(-1).values).any())
            if self.mode == "count":
                return chosen, weights
            scores = torch.softmax(logits, -1) if spec.scoring == moe.SOFTMAX else torch.sigmoid(logits)
            weights = torch.gather(scores, -1, ref)
            if spec.norm_topk:
                weights = weights / (weights.sum(-1, keepdim=True) + spec.norm_eps)
            return ref, weights * spec.scale
        return chosen, weights

    def close(self):
        moe.route = self._route


def teacher_forced(module_runner: TorchRunner, tokens: list[int]) -> np.ndarray:
    module_runner.reset()
    return module_runner.step_each(tokens).astype(np.float64)


def run_recipe(model, recipe, tokens) -> tuple[np.ndarray, list]:
    runner = TorchRunner(model, "fp32")
    runner.builder = WeightBuilder.for_architecture(recipe, model.architecture)
    with torch.no_grad():
        runner.module = model.architecture.build_decode(model.config, model.weights, runner.builder, torch.float32).eval()
    accumulate_in_fp32(runner.module)
    return teacher_forced(runner, tokens), runner.builder.entries


def residual_trace(model, tokens: list[int]) -> list[dict]:
    """After each layer at the first step: the fp32 residual's norm, the layer's update relative
    to its input (|out - in| / |in|) and int4keepproj's relative error on the residual."""
    found = []
    for recipe in ("fp32", "int4keepproj"):
        runner, rows = TorchRunner(model, recipe), []
        accumulate_in_fp32(runner.module)

        def keep(module, args, out):
            out = out[0] if isinstance(out, tuple) else out
            rows.append((args[0].detach().float().flatten(), out.detach().float().flatten()))

        hooks = [layer.register_forward_hook(keep) for layer in runner.module.layers]
        runner.reset()
        runner.step(tokens[0])
        for h in hooks:
            h.remove()
        found.append(rows)
    return [{"norm": round(float(r.norm()), 2), "update": round(float((r - x).norm() / x.norm()), 3),
             "rel_err": round(float((q - r).norm() / r.norm()), 3)} for (x, r), (_, q) in zip(*found)]  # fmt: skip


def embedding_scaled(model, tokens: list[int], factors=(4, 12)) -> dict:
    """int8keepproj and int4keepproj on the fixture with its token embedding table x k: the
    residual k times larger against the same-sized layer updates (what Granite's
    embedding_multiplier does), the rest unchanged. A tied head scales the logits by k too,
    which the relative measure does not see."""
    found = {}
    for k in factors:
        weights = DictSource({n: model.weights[n] * k if "emb" in n and "norm" not in n else model.weights[n]
                              for n in model.weights.keys()})  # fmt: skip
        scaled = dataclasses.replace(model, weights=weights)
        ref = teacher_forced(TorchRunner(scaled, "fp32"), tokens)
        for recipe in ("int8keepproj", "int4keepproj"):
            got, _ = run_recipe(scaled, get_recipe(recipe), tokens)
            found[f"embedding x{k} {recipe}"] = {"max_rel": round(float(np.abs(got - ref).max() / max(1.0, np.abs(ref).max())), 4),
                                                 "top1": int((got.argmax(1) == ref.argmax(1)).sum())}  # fmt: skip
    return found


def group_of(name: str) -> str:
    """A plan name with its layer index replaced: the tensor group."""
    return re.sub(r"\.\d+\.", ".N.", name)


def ablate(name: str, folder: Path, steps: int, replay: RoutingReplay) -> dict:
    model = load_checkpoint(folder)
    tokenizer = load_tokenizer(model.vocab_path) if model.vocab_path else None
    tokens = default_prompts(model.config.vocab_size, 1, steps, tokenizer=tokenizer)[0]
    replay.mode, replay.log = "record", []
    ref = teacher_forced(TorchRunner(model, "fp32"), tokens)
    replay.mode = "off"
    scale = max(1.0, float(np.abs(ref).max()))

    def measure(recipe) -> dict:
        got, entries = run_recipe(model, recipe, tokens)
        per_step = np.abs(got - ref).max(1) / scale
        return {"max_rel": round(float(per_step.max()), 4), "top1": int((got.argmax(1) == ref.argmax(1)).sum()),
                "per_step": [round(float(d), 3) for d in per_step], "entries": entries}  # fmt: skip

    base = get_recipe("int4keepproj")
    whole = measure(base)
    int4 = [e for e in whole.pop("entries") if e.dtype in ("int4", "uint4")]
    groups: dict[str, list[str]] = defaultdict(list)
    for e in int4:
        groups[f"{e.role} {group_of(e.name)}"].append(e.name)

    def with_storage(pick) -> dict:
        r = measure(dataclasses.replace(base, per_tensor=tuple((e.name, pick(e.name)) for e in int4)))
        del r["entries"]
        return r

    out = {"steps": len(tokens), "logit_scale": scale, "int4keepproj": whole,
           "int4 tensors at int8": with_storage(lambda n: "int8"),
           "int4 tensors at fp16": with_storage(lambda n: "float16"), "groups": {},
           "residual at step 0": residual_trace(model, tokens), "embedding scaled": embedding_scaled(model, tokens)}  # fmt: skip
    for g, names in groups.items():
        out["groups"][g] = {"shapes": [list(e.shape) for e in int4 if e.name in names],
                            "only this int4": with_storage(lambda n: "int4" if n in names else "int8"),
                            "all but this int4": with_storage(lambda n: "int8" if n in names else "int4")}  # fmt: skip
    if replay.log:  # a mixture of experts: free routing against the reference's, replayed
        for recipe in ("int8keepproj", "int4keepproj"):
            for mode in ("off", "replay"):
                replay.mode, replay.at, replay.changed, replay.calls = mode, 0, 0, 0
                r = measure(get_recipe(recipe))
                del r["entries"]
                out[f"{recipe} routing {'replayed' if mode == 'replay' else 'free'}"] = (
                    r | ({"routing_changed": replay.changed, "routing_calls": replay.calls} if mode == "replay" else {}))
        replay.mode = "off"
    return out


def weight_error(weights) -> dict:
    """Median per-tensor |deq(q(W)) - W| / |W| of the 2-D matmul weights whose input is a multiple of 32."""
    found = defaultdict(list)
    for name in weights.keys():
        w = weights[name]
        if w.ndim != 2 or "emb" in name or min(w.shape) < 32 or w.shape[1] % 32:
            continue
        w = w.float().t().contiguous()  # [in, out]
        for label, bits, affine in (("int4", 4, False), ("uint4", 4, True), ("int8", 8, False)):
            d = dequantize_blockwise(quantize_blockwise(w, bits, affine))
            found[label].append(float((d - w).norm() / w.norm()))
    return {"tensors": len(found["int4"])} | {k: round(float(np.median(v)), 4) for k, v in found.items()}


def trained_and_shuffled(steps: int = 48) -> dict:
    """rwkv7-pydoc on its held-out bytes, int8keepproj and int4keepproj (max |Δ| / scale, top-1),
    trained and with each matmul weight's entries shuffled (the same values, no structure)."""
    model = load_model("rwkv7-pydoc")
    g = torch.Generator().manual_seed(0)
    shuffled = {}
    for name in model.weights.keys():
        w = model.weights[name]
        if w.ndim == 2 and "emb" not in name and min(w.shape) >= 32:
            w = w.flatten()[torch.randperm(w.numel(), generator=g)].reshape(w.shape)
        shuffled[name] = w
    tokens = held_out_tokens(model, steps)
    found = {}
    for label, m in (("trained", model), ("shuffled", dataclasses.replace(model, weights=shuffled))):
        ref = teacher_forced(TorchRunner(m, "fp32"), tokens)
        for recipe in ("int8keepproj", "int4keepproj"):
            got, _ = run_recipe(m, get_recipe(recipe), tokens)
            found[f"{label} {recipe}"] = {"max_rel": round(float(np.abs(got - ref).max() / np.abs(ref).max()), 4),
                                          "top1": int((got.argmax(1) == ref.argmax(1)).sum()), "steps": len(tokens)}  # fmt: skip
    return found


def print_ablation(name: str, r: dict) -> None:
    line = lambda label, x: print(f"  {label:92} {x['max_rel']:.3f}  top-1 {x['top1']}/{r['steps']}")  # noqa: E731
    print(f"{name}: {r['steps']} steps, logit scale {r['logit_scale']:.2f}")
    for key in ("int4keepproj", "int4 tensors at int8", "int4 tensors at fp16"):
        line(key, r[key])
    for g, x in r["groups"].items():
        line(f"only {g} int4", x["only this int4"])
        line(f"all but {g} int4", x["all but this int4"])
    for key in [k for k in r if k.endswith(("routing free", "routing replayed"))]:
        extra = f"  (routing differs at {r[key]['routing_changed']}/{r[key]['routing_calls']})" if "replayed" in key else ""
        print(f"  {key:92} {r[key]['max_rel']:.3f}  top-1 {r[key]['top1']}/{r['steps']}{extra}")
    for key, x in r["embedding scaled"].items():
        print(f"  {key:92} {x['max_rel']:.3f}  top-1 {x['top1']}/{r['steps']}")
    print("  each layer at step 0: |x| after it, its update |out - in| / |in|, int4keepproj's error on x: "
          + ", ".join(f"{t['norm']:.1f} {t['update']:.2f} {t['rel_err']:.3f}" for t in r["residual at step 0"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fixtures", nargs="+", choices=list(_fixtures()))
    ap.add_argument("--steps", type=int, default=6, help="teacher-forced steps (the tests' gate: 6)")
    ap.add_argument("--weights", action="store_true",
                    help="also the per-weight int4 error, with rwkv7-pydoc's, and rwkv7-pydoc trained vs shuffled")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    writers, results, replay = _fixtures(), {}, RoutingReplay()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name in args.fixtures:
                folder = writers[name](Path(tmp) / name)
                results[name] = ablate(name, folder, args.steps, replay)
                print_ablation(name, results[name])
                if args.weights:
                    results[name]["weight_error"] = weight_error(load_checkpoint(folder).weights)
    finally:
        replay.close()
    if args.weights:
        results["rwkv7-pydoc weight_error"] = weight_error(load_model("rwkv7-pydoc").weights)
        print("per-weight error |deq(q(W)) - W| / |W|, median over the matmuls:")
        for name, r in results.items():
            w = r.get("weight_error", r) if isinstance(r, dict) else None
            if w and "int4" in w:
                print(f"  {name.replace(' weight_error', ''):18} {w['tensors']:3} tensors  int4 {w['int4']:.3f}  "
                      f"uint4 {w['uint4']:.3f}  int8 {w['int8']:.4f}")
        results["rwkv7-pydoc trained vs shuffled"] = trained_and_shuffled()
        print("rwkv7-pydoc, held-out bytes, max |Δ| / scale (top-1):")
        for key, r in results["rwkv7-pydoc trained vs shuffled"].items():
            print(f"  {key:24} {r['max_rel']:.3f} ({r['top1']}/{r['steps']})")
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
