"""coreai-torch's composite ops (RMSNorm, RoPE, SDPA) against ssmport's plain forms, per op and
layout: runtime ops per decode call and per prefill chunk, decode ms/token, and max |Δlogits|
against the plain bundle (teacher-forced decode, and a prompt through prefill).

    PYTHONPATH=$PWD python benchmarks/composite_ops.py                  # tiny presets, both layouts
    PYTHONPATH=$PWD python benchmarks/composite_ops.py --presets lfm2-350m --layouts ssmport \
        --variants plain rms_norm --steps 32 --context 512

Each variant is one fp32 export (synthetic weights, no gate) with `ssmport.ops.composite.chosen`
naming the ops in their composite form ("all": the three). The Linux runtime inlines a
composite, so the figures are those of its reference decomposition (docs/composite-ops.md).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

PRESETS = ("qwen3.5-tiny", "lfm2-tiny", "lfm3-tiny", "granite-hybrid-tiny", "nemotron-h-tiny", "olmo-hybrid-tiny",
           "mamba2-tiny")  # fmt: skip
VARIANTS = {"plain": (), "rms_norm": ("rms_norm",), "rope": ("rope",), "sdpa": ("sdpa",),
            "all": ("rms_norm", "rope", "sdpa")}  # fmt: skip
TOKENS = [3, 17, 5, 60, 9, 11, 2, 44, 80, 7, 30, 12, 12, 12, 91, 0]


def measure(preset: str, layout: str, ops: tuple[str, ...], steps: int, context: int | None, folder: Path) -> dict:
    import ssmport
    from ssmport.bundle import Bundle
    from ssmport.ops.composite import chosen
    from ssmport.runtime import Runner
    from ssmport.runtime.op_count import count_ops

    out = folder / f"{preset}-{layout}-{'-'.join(ops) or 'plain'}"
    with chosen(ops):
        result = ssmport.export(preset, out, synthetic=True, quant="fp32", layout=layout, gate=False, progress=False,
                       context=context)  # fmt: skip
    bundle = Bundle.open(result.path)
    counts = count_ops(bundle)
    with Runner(bundle) as runner:
        vocab = runner.vocab_size
        tokens = [t % vocab for t in TOKENS]
        decode = np.stack([runner.step(t) for t in tokens])
        runner.reset()
        prompt = runner.feed(tokens)
        elapsed, done = 0.0, 0
        while done < steps:  # in rounds that fit the context, each from the prompt's state
            runner.reset()
            runner.feed(tokens)
            n = min(steps - done, (runner.context or steps + len(tokens)) - len(tokens))
            start = time.perf_counter()
            for i in range(n):
                runner.step(tokens[i % len(tokens)])
            elapsed, done = elapsed + time.perf_counter() - start, done + n
        ms = 1000 * elapsed / steps
    return {"preset": preset, "layout": layout, "ops": list(ops), "main_ops": counts["main"].ops,
            "prefill_ops": counts["prefill"].ops if "prefill" in counts else None, "ms_per_token": ms,
            "decode_logits": decode, "prompt_logits": np.asarray(prompt)}  # fmt: skip


def main() -> None:
    warnings.simplefilter("ignore")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", nargs="+", default=list(PRESETS))
    p.add_argument("--layouts", nargs="+", default=["ssmport", "apple"])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--steps", type=int, default=64, help="decode calls timed after the teacher-forced ones")
    p.add_argument("--context", type=int, default=None)
    p.add_argument("--json", type=Path, help="write the rows here too")
    a = p.parse_args()
    rows = []
    print("| preset | layout | variant | ops/decode | ops/prefill chunk | decode ms/token | max abs Δlogits decode / prompt |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for preset in a.presets:
            for layout in a.layouts:
                base = None
                for variant in a.variants:
                    r = measure(preset, layout, VARIANTS[variant], a.steps, a.context, Path(tmp))
                    base = base or r
                    d_dec = float(np.abs(r["decode_logits"] - base["decode_logits"]).max())
                    d_pro = float(np.abs(r["prompt_logits"] - base["prompt_logits"]).max())
                    row = {k: v for k, v in r.items() if not k.endswith("_logits")} | {
                        "variant": variant, "max_dlogits_decode": d_dec, "max_dlogits_prompt": d_pro}
                    rows.append(row)
                    print(f"| {preset} | {layout} | {variant} | {r['main_ops']} | {r['prefill_ops']} | "
                          f"{r['ms_per_token']:.2f} | {d_dec:.2g} / {d_pro:.2g} |", flush=True)  # fmt: skip
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
