"""Fidelity on trained weights: the shipped rwkv7-pydoc, on held-out text it never saw.

Random weights give flat output distributions and no outlier channels, so they say little
about what fp16 or int8 do to a real model. Here the reference is BlinkDL's `rwkv` package
(`RWKV_x070`, cpu fp32) on the shipped checkpoint, and the candidates are bundles run on the
Core AI runtime:

- fp32: every logit within the fp32 recipe's gate bound (1e-4 of the logit scale);
- fp16, int8keepproj, int4keepproj: the same top-1 at every step where the reference's
  top-2 margin exceeds 0.5, and max |Δlogits| within the recipe's gate bound. The second
  check is what catches a uniformly wrong scale (e.g. an int8 head dequantized with the
  wrong scale), which rescales every logit and keeps every top-1;
- int4keepproj: its asset at most 0.75x int8keepproj's, and it passes its own gate.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rwkv7_files import rwkv_package_logits
from trained_checks import assert_keeps_confident_top1
from ssmport.loader.pretrained import BUNDLED, mean_nats
from ssmport.quant import RECIPES

PYDOC = BUNDLED["rwkv7-pydoc"]
STEPS = 48  # teacher-forced bytes of held-out text per bundle (int8/fp16 run ~0.2 s/step here)


def held_out_ids() -> list[int]:
    """The held-out text as byte-level ids (byte b is id b + 1)."""
    return [b + 1 for b in PYDOC.validation_text.read_bytes()]


@pytest.fixture(scope="module")
def reference_logits() -> np.ndarray:
    return rwkv_package_logits(PYDOC.checkpoint, held_out_ids()).numpy()


@pytest.fixture(scope="module")
def trained_bundles(bundles, export_fn):
    """rwkv7-pydoc exported once per recipe (decode only: the prefill is not under test)."""
    made = {}

    def get(quant: str):
        if quant not in made:
            made[quant] = export_fn("rwkv7-pydoc", bundles, quant=quant, gate=False, prefill_chunk=None)
        return made[quant].path

    return get


def bundle_logits(path, ids: list[int]) -> np.ndarray:
    from ssmport.runtime import Runner

    with Runner(path) as runner:
        return runner.step_each(ids)


def test_shipped_reference_loss_is_the_packages(reference_logits):
    """The fp32 reference loss `ssmport export` prints next to a bundle's is recomputed here by
    the independent implementation on the whole held-out text."""
    ids = held_out_ids()
    loss = mean_nats(reference_logits[:-1], ids[1:])
    assert loss == pytest.approx(PYDOC.reference_loss, abs=1e-4)
    assert loss < math.log(256) / 4  # trained: far below a uniform byte (5.5 nats)


def test_fp32_bundle_matches_rwkv_package(trained_bundles, reference_logits):
    ids = held_out_ids()[:STEPS]
    got = bundle_logits(trained_bundles("fp32"), ids)
    ref = reference_logits[:STEPS]
    scale = max(1.0, float(np.abs(ref).max()))
    assert np.abs(got - ref).max() <= RECIPES["fp32"].gate.max_rel_logit_delta * scale


@pytest.mark.parametrize("quant", ["fp16", "int8keepproj", "int4keepproj"])
def test_quantized_bundle_keeps_confident_top1(trained_bundles, reference_logits, quant):
    ids = held_out_ids()[:STEPS]
    assert_keeps_confident_top1(bundle_logits(trained_bundles(quant), ids), reference_logits[:STEPS], quant)


def test_int4keepproj_fits_where_int8keepproj_does_not_and_gates(trained_bundles, capsys):
    from ssmport.bundle import Bundle
    from ssmport.cli.main import main

    int4, int8 = (Bundle.open(trained_bundles(q)).manifest for q in ("int4keepproj", "int8keepproj"))
    assert int4.asset.bytes <= 0.75 * int8.asset.bytes
    assert main(["gate", str(trained_bundles("int4keepproj")), "--prompts", "1", "--steps", "8"]) == 0
    assert "PASS" in capsys.readouterr().out


def test_int4keepproj_in_apples_layout_gates_and_an_engine_drives_it(bundles, export_fn, capsys):
    """4-bit storage is inside the asset, which Apple's loader hands to Core AI: the engine rules
    read the metadata and the functions' signatures, which int4 does not change."""
    from ssmport.cli.main import main

    result = export_fn("rwkv7-pydoc", bundles / "apple", quant="int4keepproj", layout="apple", gate_steps=4,
                       prefill_chunk=8)  # fmt: skip
    assert result.manifest.gate.passed  # its gate ran the bundle on the Core AI runtime
    assert "int4" in result.manifest.plan["summary"]["by_dtype"]
    assert main(["check-engine", str(result.path)]) == 0
    assert "coreai-sequential @prefill-graph  drives" in capsys.readouterr().out


def test_export_prints_validation_loss(tmp_path, capsys):
    """The README's first command: export prints the gate and the held-out loss, which for an
    fp32 bundle is the reference's."""
    from ssmport.cli.main import main

    assert main(["export", "rwkv7-pydoc", "--quant", "fp32", "-o", str(tmp_path), "-q", "--no-prefill"]) == 0
    out = capsys.readouterr().out
    assert "gate: PASS fp32" in out
    line = next(line for line in out.splitlines() if line.startswith("validation: "))
    assert float(line.split()[1]) == pytest.approx(PYDOC.reference_loss, abs=1e-3)


def test_trained_weights_load_strictly_as_blinkdl():
    """The shipped file is a plain BlinkDL checkpoint: the preset loads it through the strict
    .pth loader, and its config is the preset's."""
    from ssmport.loader.resolve import load_model

    model = load_model("rwkv7-pydoc")
    assert model.provenance["kind"] == "pth" and not model.synthetic
    assert model.config.vocab_size == 320 and model.vocab_path.name == "vocab.tsv"
    sd = torch.load(PYDOC.checkpoint, weights_only=True)
    assert {t.dtype for t in sd.values()} == {torch.float16}
