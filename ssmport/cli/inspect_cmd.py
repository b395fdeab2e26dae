"""ssmport inspect BUNDLE: what is inside, and how it was checked."""

from __future__ import annotations

import math

from ssmport.cli.common import human_bytes


def add_parser(sub) -> None:
    p = sub.add_parser(
        "inspect",
        help="names, shapes, dtypes, sizes, config, quant plan, gate result",
        description="Show a bundle's interface (inputs, states, outputs), config, quantization "
        "plan totals by category with the asset size next to the plan's analytic size, "
        "tokenizer, export stats and gate result.",
    )
    p.add_argument("bundle")
    p.add_argument("--json", action="store_true", help="print the manifest (without the per-tensor plan)")
    p.add_argument("--plan", action="store_true", help="also list every tensor of the quant plan")
    p.add_argument("--count-ops", action="store_true",
                   help="count the runtime ops per call now (loads the bundle on the Core AI runtime)")  # fmt: skip
    p.set_defaults(func=run)


def run(args) -> int:
    from ssmport.bundle import Bundle, dir_bytes

    bundle = Bundle.open(args.bundle)
    m = bundle.manifest
    on_disk = dir_bytes(bundle.asset_path)
    if args.json:
        from ssmport.strict_json import dumps_standard

        out = m.to_json()
        if not args.plan:
            out["plan"] = {"summary": m.plan["summary"]}
        print(dumps_standard(out | {"asset_bytes_on_disk": on_disk}, indent=2))
        return 0
    synthetic = "  [SYNTHETIC WEIGHTS]" if m.synthetic_weights else ""
    print(f"{m.name}  ({m.architecture}, ssmport {m.ssmport_version}){synthetic}")
    print(f"source: {_source(m.source)}")
    print("config: " + ", ".join(f"{k}={v}" for k, v in m.config.items()))
    print(f"recipe: {m.recipe.name} (state dtype {m.recipe.state_dtype}): {m.recipe.description}")
    print(f"function: {m.main.function}")
    _print_interface(m.main, m.states)
    if m.context is not None:
        per_token = m.kv_bytes_per_token
        print(f"kv cache: {m.context} positions (fixed at export, --context): {human_bytes(per_token)} per token of "
              f"context, {human_bytes(per_token * m.context)} in all; fixed states {human_bytes(m.fixed_state_bytes)}")  # fmt: skip
    if m.ring_states:
        ring_bytes = sum(math.prod(s.full_shape) * _itemsize(s.dtype) for s in m.ring_states)
        windows = "/".join(str(w) for w in sorted({s.window for s in m.ring_states}))
        verb = "are" if len(m.ring_states) > 1 else "holds"  # the apple layout keeps every ring in one state
        print(f"sliding window: {', '.join(s.name for s in m.ring_states)} {verb} rings of {windows} positions, "
              f"{human_bytes(ring_bytes)} whatever the context (not sized by --context)")  # fmt: skip
    if m.prefill:
        print(f"function: {m.prefill.function} (chunked prefill, {m.prefill.chunk} tokens per call; same states)")
        _print_interface(m.prefill, ())
    else:
        print("function: no prefill (prompts run one token at a time)")
    if m.verify:
        print(f"function: {m.verify.function} (speculative decoding, checks up to {m.verify.chunk} drafted tokens "
              "per call; same states)")  # fmt: skip
        _print_interface(m.verify, ())
    if m.draft:
        print(f"function: {m.draft.function} (the checkpoint's draft head, `--draft mtp`: up to {m.draft.chunk} rows of "
              "token, hidden state and position per call; its own states)")  # fmt: skip
        _print_interface(m.draft, m.draft.states)
    summary = m.plan["summary"]
    print("weights by category:")
    for role, nbytes in sorted(summary["by_role"].items(), key=lambda kv: -kv[1]):
        entries = [e for e in m.plan_tensors if e["role"] == role]
        shares = sorted({e["shares"] for e in entries if e.get("shares")})  # a tied table, stored in the head
        note = f" (read from {', '.join(shares)})" if shares else ""
        print(f"  {role:12} {human_bytes(nbytes):>10}  {'/'.join(sorted({e['dtype'] for e in entries}))}{note}")
    print("weights by dtype: " + ", ".join(f"{d} {human_bytes(b)}" for d, b in summary["by_dtype"].items()))
    analytic = summary["total"]
    print(f"asset: {human_bytes(on_disk)} on disk vs {human_bytes(analytic)} analytic "
          f"({100 * (on_disk / analytic - 1):+.1f}%)")  # fmt: skip
    if "auto" in m.plan:
        _print_auto(m.plan["auto"])
    if args.plan:
        for e in m.plan_tensors:
            block = f" block {e['block']}" if e["block"] else ""
            shared = f" (read from {e['shares']})" if e.get("shares") else ""
            print(f"    {e['name']:40} {e['role']:10} {str(e['shape']):16} {e['dtype']}{block} {human_bytes(e['bytes'])}{shared}")
    tok = m.tokenizer
    if tok:
        print(f"tokenizer: {tok.path} ({tok.entries} entries, sha256 {tok.sha256[:16]}…, {tok.origin})")
    else:
        print("tokenizer: none")
    if "seconds" in m.export:
        print(f"export: {m.export['seconds']} s, peak RSS {m.export['peak_rss_mb']} MB")
    g = m.gate
    if g:
        verdict = "PASS" if g.passed else "FAIL"
        ties = f" (+{g.top1_excused_ties} near-tie)" if g.top1_excused_ties else ""
        print(f"gate: {verdict} top-1 {g.top1_agree}/{g.steps}{ties}, max |Δlogits| "
              f"{g.max_abs_logit_delta:.3g} (rel {g.max_rel_logit_delta:.2e}) over {g.prompts} stream(s)")  # fmt: skip
        if g.functions_not_run:
            print(f"      the decode function only: {' and '.join(g.functions_not_run)} not run (ssmport gate BUNDLE runs it)")
        if g.noise_floor:
            f = g.noise_floor
            print(f"      judged vs fp64: rel {f['bundle_vs_fp64_rel']:.2e}; the fp32 reference's own floor "
                  f"{f['reference_vs_fp64_rel']:.2e}; limit {f['limit_rel']:.2g}")  # fmt: skip
        if g.runtime_floor:
            r = g.runtime_floor
            twin = "" if r["bundle_vs_twin_rel"] is None else f"; vs the recipe with this runtime's sums {r['bundle_vs_twin_rel']:.2e}"
            print(f"      the fp16 floor (the reference in fp16 with this runtime's sums) "
                  f"{r['reference_in_fp16_vs_reference_rel']:.2e}; limit {r['limit_rel']:.2g}{twin}")  # fmt: skip
        if g.recipe_split:
            print(f"      the recipe alone (torch, same stored weights, fp32 sums) rel "
                  f"{g.recipe_split['recipe_vs_reference_rel']:.2e}")  # fmt: skip
    else:
        print("gate: not run (ssmport gate BUNDLE)")
    _print_ops(bundle, args.count_ops)
    return 0


def _print_auto(auto: dict) -> None:
    """What `--quant auto` measured and chose (ssmport.quant.auto)."""
    from ssmport.quant.auto import FORMS

    cal = auto["calibration"]
    print(f"auto: budget {human_bytes(auto['budget_bytes'])} ({auto['budget_bytes']:,} bytes): weights "
          f"{auto['plan_bytes']:,} + {auto['reserved_for_graph_bytes']:,} reserved for the graph; chosen per "
          f"{auto['granularity']} by {cal['measure']} over {cal['steps']} calibration steps (logit scale "
          f"{cal['logit_scale']:.3g})")  # fmt: skip
    print(f"    {'tensor' if auto['granularity'] == 'tensor' else 'role':44} {'chosen':8} {'bytes':>10}  "
          + "  ".join(f"{'mse ' + f:>13}" for f in FORMS))  # fmt: skip
    for g in auto["sensitivity"]:
        mse = "  ".join(f"{g['mse'][f]:>13.3e}" if f in g["mse"] else f"{'-':>13}" for f in FORMS)
        print(f"    {g['group'][:44]:44} {g['chosen']:8} {human_bytes(g['bytes'][g['chosen']]):>10}  {mse}")


def _print_ops(bundle, count_now: bool) -> None:
    """Runtime kernels per decode call and per prefill chunk: recorded at export (with the
    gate), or counted now."""
    ops, when = bundle.manifest.export.get("runtime_ops"), "at export"
    if count_now:
        from ssmport.runtime.op_count import count_ops

        ops, when = {f: c.to_json() for f, c in count_ops(bundle).items()}, "counted now"
    if not ops:
        print("runtime ops: not recorded (exported without the gate); --count-ops counts them")
        return
    line = f"runtime ops: decode {ops['main']['ops']} kernels per call"
    if "prefill" in ops:
        line += f", prefill {ops['prefill']['ops']} per chunk"
    elif bundle.manifest.prefill is not None:
        line += ", prefill not counted at export (fp32 bundles only: --count-ops counts it)"
    if "verify" in ops:
        line += f", verify {ops['verify']['ops']} per call of {bundle.manifest.verify.chunk} rows"
    if "draft" in ops:
        line += f", draft {ops['draft']['ops']} per call"
    print(f"{line} (Core AI runtime Profiler, {when}; a GPU dispatch each)")


def _print_interface(function, states) -> None:
    for kind, entries in (("input", function.inputs), ("state", states), ("output", function.outputs)):
        for t in entries:
            # a growing state (a dynamic KV cache or ring) at its largest, not its -1 placeholder;
            # an input with a dynamic axis (the apple layout's tokens) has no size until a call
            shape = getattr(t, "full_shape", t.shape)
            size = human_bytes(math.prod(shape) * _itemsize(t.dtype)) if min(shape, default=0) >= 0 else "per call"
            layout = f"  {t.axes}" if getattr(t, "axes", "") else ""
            print(f"  {kind:6} {t.name:14} {str(list(t.shape)):22} {t.dtype:8} {size:>9}{layout}")


def _source(src: dict) -> str:
    """The manifest's `source` (an `ssmport.architectures.base.Provenance`: only `kind` is
    sure to be there; a hand-built LoadedModel may give nothing else)."""
    preset = f"preset {src['preset']}" if "preset" in src else None
    if src.get("kind") == "synthetic":
        seed = f" (seed {src['seed']})" if "seed" in src else ""
        return f"synthetic weights for {preset or 'a config given in code'}{seed}"
    return f"{src.get('kind')} {src.get('path') or '(no path recorded)'}" + (f" ({preset})" if preset else "")


def _itemsize(dtype: str) -> int:
    return {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8, "int8": 1}.get(dtype, 4)
