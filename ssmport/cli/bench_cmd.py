"""ssmport bench BUNDLE: decode ms/token and load times."""

from __future__ import annotations

import json

from ssmport.errors import SsmportError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="decode ms/token on the Core AI runtime vs torch eager, and load times",
        description="Measure bundle load time (first: lower + load; second: cached), decode "
        "ms/token on the Core AI runtime, and the fp32 torch reference eager at 1 thread and at "
        "the default thread count, in one process.",
    )
    p.add_argument("bundle")
    p.add_argument("--steps", type=int, default=32, help="timed tokens (default 32)")
    p.add_argument("--warmup", type=int, default=4, help="untimed tokens first (default 4)")
    p.add_argument("--prompt-tokens", type=int, default=128, help="prompt length for prefill tokens/s (default 128)")
    p.add_argument("--no-torch", action="store_true", help="skip the torch eager comparison")
    p.add_argument("--weights", help="source checkpoint, if it moved since export")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from ssmport.bench import bench_bundle
    from ssmport.bundle import Bundle

    if args.prompt_tokens < 1:
        raise SsmportError("--prompt-tokens must be at least 1")
    r = bench_bundle(Bundle.open(args.bundle), args.steps, args.warmup, not args.no_torch, args.weights, args.prompt_tokens)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"{r['bundle']} ({r['recipe']}), {r['steps']} timed tokens")
    print(f"  load: first {r['load_first_s']:.2f} s (lower + load), second {r['load_second_s']:.3f} s")
    rows = [("Core AI runtime (1 thread)", r["coreai_ms_per_token"])]
    if "torch_fp32_ms_per_token" in r:
        rows += [("torch eager fp32, 1 thread", r["torch_fp32_1thread_ms_per_token"]),
                 (f"torch eager fp32, {r['torch_threads']} threads", r["torch_fp32_ms_per_token"])]  # fmt: skip
    for label, ms in rows:
        print(f"  {label:28} {ms:8.2f} ms/token")
    prefill = (f"prompt (prefill, {r['prefill_prompt_tokens']} tokens) {r['prefill_tokens_per_s']:.1f} tokens/s"
               if "prefill_tokens_per_s" in r else "prompt: no prefill function (M=1 loop)")  # fmt: skip
    print(f"  Core AI decode {r['decode_tokens_per_s']:.1f} tokens/s; {prefill}")
    return 0
