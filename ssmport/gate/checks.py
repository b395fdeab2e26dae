"""The checks of a finished bundle that an export runs beside the gate (ssmport.gate.run):
its `verify` function against `main` (ssmport.verify), and a shipped model's held-out score
(ssmport.loader.pretrained holds the data; scoring a bundle runs it, so it lives here, above both)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ssmport.bundle import Bundle
from ssmport.errors import SsmportError
from ssmport.gate.report import default_prompts
from ssmport.gate.run import bundle_tokenizer
from ssmport.loader.pretrained import BundledModel, bundled_model_of, validation_loss
from ssmport.quant import get_recipe
from ssmport.quant.recipes import gate_thresholds
from ssmport.runtime.runner import Runner


def check_against_main(bundle: Bundle) -> float:
    """The export's check of `verify`: its logits for K tokens against `main`'s, fed one by one,
    within the recipe's gate bound (relative to the logit scale); the relative delta. One line
    (and no bundle) when over it."""
    m = bundle.manifest
    bound = gate_thresholds(get_recipe(m.recipe.name), m.recipe.state_dtype, m.main.outputs[0].dtype).max_rel_logit_delta
    with Runner(bundle, prefill=False) as runner:
        tokens = default_prompts(m.vocab_size, 1, runner.verify_rows)[0][: runner.verify_rows]
        want = runner.step_each(tokens).astype(np.float64)
        runner.reset()
        got = runner.verify(tokens).astype(np.float64)
    rel = float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))
    if not rel <= bound:
        raise SsmportError(f"the verify function's logits differ from main's by {rel:.2e} of the logit scale (the "
                           f"{m.recipe.name} gate allows {bound:.2g}); export without --verify")  # fmt: skip
    return rel


def score_bundle(path: str | Path) -> tuple[BundledModel, float, int] | None:
    """(the shipped model, nats per byte, bytes) of an exported bundle of a shipped model on
    its held-out text, run on the Core AI runtime; None for any other bundle."""
    bundle = Bundle.open(path)
    model = bundled_model_of(bundle.manifest.source)
    tokenizer = bundle_tokenizer(bundle)
    if model is None or tokenizer is None:
        return None
    with Runner(bundle) as runner:
        loss, scored = validation_loss(model, runner.step_each, tokenizer.encode)
    return model, loss, scored


__all__ = ["check_against_main", "score_bundle"]
