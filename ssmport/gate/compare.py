"""`ssmport gate BUNDLE --compare`: every recipe's gate on the same streams, side by side.

The bundle's source model is exported under each other recipe into a temporary directory
(same state dtype), each export is gated on identical token streams, and the table shows
how faithful each recipe is to the fp32 torch reference.
"""

from __future__ import annotations

import shutil
import tempfile

from ssmport.bundle import Bundle
from ssmport.exporter.pipeline import export
from ssmport.gate.run import gate_bundle
from ssmport.gate.report import GateReport
from ssmport.interrupts import cleaned_at_hard_stop
from ssmport.quant import RECIPES
from ssmport.loader.resolve import rebuild_bundle_source

COMPARED = ("fp16", "int8keepproj", "int8")


def compare_recipes(
    bundle: Bundle, streams: list[list[int]], weights=None
) -> list[tuple[str, int, GateReport]]:
    """(recipe, asset bytes, gate report) for the bundle's own recipe and each of COMPARED,
    in recipe order. The bundle's own gate is recorded in it, as `ssmport gate` does."""
    m = bundle.manifest
    model = rebuild_bundle_source(m, weights)
    state = m.recipe.state_dtype
    own = m.recipe.name
    rows = [(own, m.asset.bytes, gate_bundle(bundle, model, token_streams=streams))]
    with tempfile.TemporaryDirectory(prefix="ssmport-compare-") as tmp, \
            cleaned_at_hard_stop(lambda: shutil.rmtree(tmp, ignore_errors=True)):
        for recipe in COMPARED:
            if recipe == own:
                continue
            result = export(model, tmp, quant=recipe, state_dtype=state, gate=False, progress=False)
            other = Bundle.open(result.path)
            report = gate_bundle(other, model, token_streams=streams, record=False)
            rows.append((recipe, other.manifest.asset.bytes, report))
    return sorted(rows, key=lambda r: list(RECIPES).index(r[0]))
