"""ssmport bench BUNDLE: load times, decode ms/token, bytes per token vs memory bandwidth."""

from __future__ import annotations

import json

from ssmport.bench import DEFAULT_PREFILL_TOKENS, DEFAULT_STEPS, DEFAULT_WARMUP
from ssmport.cli.common import check_int
from ssmport.layout import PREFILL_CALL

MAX_BENCH_TOKENS = 100_000  # per measurement: minutes on a small model, bounded memory


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="load times, decode ms/token, weight bytes per token and the memory roofline",
        description="Measure, in one process: bundle load time (first: hash + lower + load; "
        "cached), decode ms/token on the Core AI runtime (median over --steps tokens after "
        "--warmup), prefill tokens/s when the bundle has a prefill function, runtime ops per "
        "decode call and per prefill chunk (the runtime Profiler's count), state and asset "
        "bytes, weight bytes read per token (from the manifest's plan) and the effective GB/s, "
        "against the machine's single-thread memory read bandwidth. --torch adds the fp32 "
        "torch eager reference of the same model at 1 thread and at the default thread count.",
    )
    p.add_argument("bundle")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=f"timed tokens (default {DEFAULT_STEPS})")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help=f"untimed tokens first (default {DEFAULT_WARMUP})")
    p.add_argument("--prefill-tokens", type=int, default=DEFAULT_PREFILL_TOKENS,
                   help=f"prompt length for the prefill measurement (default {DEFAULT_PREFILL_TOKENS})")  # fmt: skip
    p.add_argument("--torch", action="store_true", help="also time the torch eager reference")
    p.add_argument("--no-roofline", action="store_true", help="skip the memory bandwidth measurement")
    p.add_argument("--weights", help="source checkpoint for --torch, if it moved since export")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from ssmport.bench import bench_bundle
    from ssmport.bundle import Bundle

    check_int(args.steps, "--steps", 1, MAX_BENCH_TOKENS)
    check_int(args.warmup, "--warmup", 0, MAX_BENCH_TOKENS)
    check_int(args.prefill_tokens, "--prefill-tokens", 1, MAX_BENCH_TOKENS)
    bundle = Bundle.open(args.bundle)
    if args.torch:  # the torch source must be the bundle's model: checked before minutes of timing
        from ssmport.loader.resolve import rebuild_bundle_source

        rebuild_bundle_source(bundle.manifest, args.weights)
    r = bench_bundle(
        bundle,
        steps=args.steps,
        warmup=args.warmup,
        torch_backend=args.torch,
        weights=args.weights,
        roofline=not args.no_roofline,
        prefill_tokens=args.prefill_tokens,
    )
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    mb = 1e6
    print(f"{r['bundle']} ({r['recipe']}), median of {r['steps']} tokens after {r['warmup']} warm-up")
    print(f"  load           first {r['load_s_first']:.2f} s (hash + lower + load), cached {r['load_s_cached']:.3f} s")
    print(f"  decode         {r['decode_ms_per_token']:.2f} ms/token (Core AI runtime, single-threaded)")
    prefill = r["prefill_tokens_per_s"]
    through = "" if r["prompt_calls"] == PREFILL_CALL else " (one token a call through main: chunks cost more here)"
    print(f"  prefill        {f'{prefill:.1f} tokens/s{through}' if prefill is not None else 'n/a (no prefill function)'}")
    print(f"  ops/call       {ops_line(r)}")
    if r["context"] is None:
        print(f"  state          {r['state_bytes'] / mb:.2f} MB (fixed: independent of context length)")
    else:
        print(f"  state          {r['fixed_state_bytes'] / mb:.2f} MB fixed + KV cache {r['kv_bytes_per_token']} B per token "
              f"of context ({(r['state_bytes'] - r['fixed_state_bytes']) / mb:.2f} MB at {r['context']} positions)")  # fmt: skip
        print(f"  KV read        {r['kv_bytes_read_per_token'] / mb:.2f} MB per decode call at {r['steps'] + r['warmup']} "
              f"tokens held ({r['kv_positions_read']} positions)")  # fmt: skip
    if r["ring_slots_read"]:
        print(f"  ring read      {r['ring_bytes_read_per_token'] / mb:.2f} MB per decode call at {r['steps'] + r['warmup']} "
              f"tokens held ({r['ring_slots_read']} slots)")  # fmt: skip
    print(f"  asset          {r['asset_bytes'] / mb:.1f} MB")
    print(f"  weights/token  {r['weight_bytes_per_token'] / mb:.1f} MB -> {r['effective_gb_per_s']:.2f} GB/s effective")
    if "read_bandwidth_gb_per_s" in r:
        print(f"  roofline       {r['read_bandwidth_gb_per_s']:.2f} GB/s measured single-thread read bandwidth: "
              f"decode at {100 * r['roofline_fraction']:.0f}% of it")  # fmt: skip
    if "torch_ms_per_token" in r:
        print(f"  torch eager    {r['torch_ms_per_token_1thread']:.2f} ms/token at 1 thread, "
              f"{r['torch_ms_per_token']:.2f} at {r['torch_threads']} threads (fp32)")  # fmt: skip
    return 0


def ops_line(r: dict) -> str:
    """Runtime kernels per decode call and per prefill chunk (a GPU dispatch each)."""
    main = r["runtime_ops"]["main"]
    line = f"decode {main['ops']} kernels"
    extra = [f"{main[k]} {k}" for k in ("shape", "bookkeeping") if main[k]]
    if extra:
        line += f" (+ {', '.join(extra)} events)"
    if r["ops_per_prefill_chunk"] is not None:
        line += f"; prefill {r['ops_per_prefill_chunk']} kernels per chunk"
    return line
