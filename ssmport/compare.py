"""`ssmport gate BUNDLE --compare`: every recipe's gate on the same streams, side by side.

The bundle's source model is exported under each other recipe into a temporary directory
(same state dtype), each export is gated on identical token streams, and the table shows
how faithful each recipe is to the fp32 torch reference.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ssmport.bundle import Bundle
from ssmport.cli.common import human_bytes
from ssmport.export import export
from ssmport.gate import DEFAULT_PROMPTS, DEFAULT_STEPS, bundle_tokenizer, gate_bundle
from ssmport.parity import GateReport, default_prompts
from ssmport.quant import RECIPES
from ssmport.sources import rebuild_source
from ssmport.state import STATE_DTYPES, dtype_name

COMPARED = ("fp16", "int8keepproj", "int8")


def compare_recipes(bundle: Bundle, args, streams: list[list[int]] | None) -> int:
    m = bundle.manifest
    model = rebuild_source(m["source"], getattr(args, "weights", None))
    if streams is None:
        streams = default_prompts(
            model.config.vocab_size,
            getattr(args, "prompts", DEFAULT_PROMPTS),
            getattr(args, "steps", DEFAULT_STEPS),
            tokenizer=bundle_tokenizer(bundle),
        )
    state = next(k for k, v in STATE_DTYPES.items() if dtype_name(v) == m["recipe"]["state_dtype"])
    rows: list[tuple[str, int, GateReport]] = []
    own = m["recipe"]["name"]
    rows.append((own, m["asset"]["bytes"], gate_bundle(bundle, model, token_streams=streams)))
    with tempfile.TemporaryDirectory(prefix="ssmport-compare-") as tmp:
        for recipe in COMPARED:
            if recipe == own:
                continue
            result = export(model, tmp, quant=recipe, state_dtype=state, gate=False, progress=False)
            other = Bundle.open(result.path)
            rows.append((recipe, other.manifest["asset"]["bytes"],
                         gate_bundle(other, model, token_streams=streams, record=False)))  # fmt: skip
    rows.sort(key=lambda r: list(RECIPES).index(r[0]))
    print(f"{len(streams)} stream(s), {sum(map(len, streams))} teacher-forced steps vs the fp32 torch reference"
          + (" [synthetic weights]" if model.synthetic else ""))  # fmt: skip
    print(f"{'recipe':14} {'asset':>10} {'top-1':>9} {'ties':>5} {'miss':>5} {'max|Δ|':>9} {'rel':>9} {'limit':>7}  verdict")
    for name, nbytes, r in rows:
        s = r.summary()
        print(f"{name:14} {human_bytes(nbytes):>10} {s['top1_agree']:>4}/{r.n:<4} {s['top1_excused_ties']:>5} "
              f"{s['top1_mismatch']:>5} {s['max_abs_logit_delta']:>9.3g} {s['max_rel_logit_delta']:>9.2e} "
              f"{r.thresholds['max_rel_logit_delta']:>7.0e}  {'PASS' if r.passed else 'FAIL'}")  # fmt: skip
    own_report = next(r for name, _, r in rows if name == own)
    return 0 if own_report.passed else 1
