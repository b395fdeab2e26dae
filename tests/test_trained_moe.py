"""Fidelity on a trained mixture of experts: the byte-level LFM2-MoE of tests/data/lfm2_moe_pydoc
(transformers' `Lfm2MoeForCausalLM`, trained by tools/train_moe.py on the rwkv7-pydoc corpus),
on held-out text neither model saw.

The random MoE fixtures of tests/test_moe.py say little about 4 bits (their layer updates are
as large as the residual and random routers flip; docs/quantization.md). Here the reference is
transformers' own class in fp32 on the committed folder, and the candidates are bundles on the
Core AI runtime, each exported once with its gate:

- int8keepproj and int4keepproj: every top-1 whose reference top-2 margin exceeds 0.5 kept,
  max |Δlogits| within the recipe's gate bound, and the export's gate passed;
- int4keepproj's asset at most 0.75x int8keepproj's;
- `--quant auto --size-budget`: the asset within the budget, its gate passed; a budget below
  the smallest bundle is one line and leaves nothing behind.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import hybrid_files as hf
import moe_files as mf
from trained_checks import assert_keeps_confident_top1
from ssmport.loader.pretrained import BUNDLED, mean_nats
from ssmport.quant.budget import parse_size

FOLDER = Path(__file__).resolve().parent / "data" / "lfm2_moe_pydoc"
STEPS = 96  # teacher-forced held-out bytes per bundle
BUDGET = "1.9MB"  # between int4keepproj's asset and int8keepproj's (docs/quantization.md)
UNIGRAM_LOSS = 3.4  # nats/byte of the training split's byte frequencies on the held-out split (3.4058)


def held_out_ids() -> list[int]:
    """The held-out text (rwkv7-pydoc's validation.txt: a file of the split neither model
    trained on) as byte ids, through the folder's own vocab."""
    from ssmport.tokenizers import load_tokenizer

    return load_tokenizer(FOLDER / "vocab.tsv").encode(BUNDLED["rwkv7-pydoc"].validation_text.read_text("utf-8"))


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    return hf.full_logits(FOLDER, held_out_ids()).numpy()


@pytest.fixture(scope="module")
def trained_bundles(bundles, export_fn):
    """The folder exported once per recipe (decode only; the export's gate on)."""
    made = {}

    def get(quant: str):
        if quant not in made:
            budget = {"size_budget": BUDGET} if quant == "auto" else {}
            made[quant] = export_fn(FOLDER, bundles / f"moe-{quant}", quant=quant, prefill_chunk=None, **budget)
        return made[quant]

    return get


def test_the_model_is_trained_and_routes_every_expert(reference):
    ids = held_out_ids()
    assert ids[:3] == [b + 1 for b in BUNDLED["rwkv7-pydoc"].validation_text.read_bytes()[:3]]
    assert mean_nats(reference[:-1], ids[1:]) < UNIGRAM_LOSS - 1  # far below the unigram baseline
    routing = mf.routed_experts(FOLDER, ids, "Lfm2MoeTopKRouter")
    assert len(routing) == 4
    for chosen, _ in routing:  # every expert of every MoE layer chosen on the held-out bytes
        assert set(chosen.flatten().tolist()) == set(range(8))
    assert len({tuple(sorted(row)) for chosen, _ in routing for row in chosen.tolist()}) >= 20


def bundle_logits(path, ids: list[int]) -> np.ndarray:
    from ssmport.runtime import Runner

    with Runner(path) as runner:
        return runner.step_each(ids)


@pytest.mark.parametrize("quant", ["int8keepproj", "int4keepproj"])
def test_quantized_bundle_keeps_confident_top1_and_passes_its_gate(trained_bundles, reference, quant):
    bundle = trained_bundles(quant)
    assert bundle.manifest.gate.passed and not bundle.manifest.gate.synthetic_weights
    assert_keeps_confident_top1(bundle_logits(bundle.path, held_out_ids()[:STEPS]), reference[:STEPS], quant)
    stacks = [e for e in bundle.manifest.plan_tensors if e.get("rows_read")]
    assert len(stacks) == 2 * 4 and all(e["rows_read"] == 2 for e in stacks)  # gathered: 2 of 8 experts read


def test_int4keepproj_asset_is_at_most_three_quarters_of_int8keepproj(trained_bundles):
    int4, int8 = (trained_bundles(q).manifest.asset.bytes for q in ("int4keepproj", "int8keepproj"))
    assert int4 <= 0.75 * int8


def test_auto_fits_its_budget_and_passes_its_gate(trained_bundles):
    m = trained_bundles("auto").manifest
    assert m.recipe.name == "auto" and m.plan["auto"]["budget_bytes"] == parse_size(BUDGET)
    assert m.asset.bytes <= parse_size(BUDGET)
    assert m.gate.passed
    # the budget is below int8keepproj's asset: auto stored some tensors at 4 bits
    assert "int4" in m.plan["summary"]["by_dtype"]


def test_a_budget_too_small_is_one_line(tmp_path, capsys):
    from ssmport.cli.main import main

    assert main(["export", str(FOLDER), "--quant", "auto", "--size-budget", "256KB", "-o", str(tmp_path), "-q"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "below the smallest lfm2_moe_pydoc bundle auto can make" in err, err
    assert not any(tmp_path.iterdir())  # no partial bundle


def test_committed_weights_are_fp16_safetensors():
    from safetensors import safe_open

    with safe_open(FOLDER / "model.safetensors", "pt") as f:
        assert {f.get_slice(n).get_dtype() for n in f.keys()} == {"F16"}
        assert any(".feed_forward.experts." in n for n in f.keys())
