"""Fidelity on trained mixtures of experts: the byte-level models of tests/data/*_moe_pydoc
(transformers' own `Lfm2MoeForCausalLM`, `Qwen3_5MoeForCausalLM`, ..., trained by
tools/train_moe.py on the rwkv7-pydoc corpus), on held-out text none of them saw.

The random MoE fixtures of tests/test_moe.py say little about 4 bits (their layer updates are
as large as the residual and random routers flip; docs/quantization.md). Here the reference is
transformers' own class in fp32 on the committed folder, and the candidates are bundles on the
Core AI runtime, each exported once with its gate:

- int8keepproj and int4keepproj: every top-1 whose reference top-2 margin exceeds 0.5 kept,
  max |Δlogits| within the recipe's gate bound, and the export's gate passed;
- int4keepproj's routed experts at the width the family's INT4_SAFE_EXPERTS measured (4 bits
  or int8), and its asset within the ratio to int8keepproj's that this gives (docs/quantization.md);
- LFM2-MoE's `--quant auto --size-budget`: the asset within the budget, its gate passed; a
  budget below the smallest bundle is one line and leaves nothing behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import hybrid_files as hf
import moe_files as mf
from trained_checks import assert_keeps_confident_top1
from ssmport.loader.pretrained import BUNDLED, mean_nats
from ssmport.quant.budget import parse_size

DATA = Path(__file__).resolve().parent / "data"
FOLDER = DATA / "lfm2_moe_pydoc"
STEPS = 96  # teacher-forced held-out bytes per bundle
BUDGET = "1.9MB"  # between int4keepproj's asset and int8keepproj's (docs/quantization.md)
UNIGRAM_LOSS = 3.4  # nats/byte of the training split's byte frequencies on the held-out split (3.4058)


@dataclass(frozen=True)
class Trained:
    folder: Path
    router_class: str  # transformers' router module (tests/moe_files.routed_experts)
    moe_layers: int
    int4_experts: bool  # the family's INT4_SAFE_EXPERTS, as measured (docs/quantization.md)
    max_int4_ratio: float  # int4keepproj's asset over int8keepproj's: measured, rounded up
    # experts of each MoE layer chosen on the 241 held-out bytes: all 8 but where an expert is
    # rare (every expert is chosen on the first 32,768 held-out bytes; the rarest takes 0.10% of
    # Qwen3.5-MoE's last layer's choices there, 0.13% of Granite's: their model cards)
    experts_seen: tuple[int, ...] = ()


# 8 experts top-2 in each; ratios from benchmarks/trained_moe.py (docs/quantization.md)
TRAINED = {
    "lfm2_moe": Trained(FOLDER, "Lfm2MoeTopKRouter", 4, True, 0.75),  # measured 0.68
    "nemotron_h": Trained(DATA / "nemotron_h_moe_pydoc", "NemotronHTopkRouter", 5, True, 0.76),  # 0.755
    "granitemoehybrid": Trained(DATA / "granitemoehybrid_moe_pydoc", "GraniteMoeHybridTopKRouter", 6, True, 0.71,
                                 (7, 8, 8, 8, 8, 6)),  # 0.705
    "qwen3_5_moe": Trained(DATA / "qwen3_5_moe_pydoc", "Qwen3_5MoeTopKRouter", 6, True, 0.69, (8, 8, 8, 8, 8, 7)),  # 0.683
}


def held_out_ids(folder: Path = FOLDER) -> list[int]:
    """The held-out text (rwkv7-pydoc's validation.txt: a file of the split none of the models
    trained on) as byte ids, through the folder's own vocab."""
    from ssmport.tokenizers import load_tokenizer

    return load_tokenizer(folder / "vocab.tsv").encode(BUNDLED["rwkv7-pydoc"].validation_text.read_text("utf-8"))


@pytest.fixture(scope="module")
def references():
    """transformers' fp32 logits of a family's folder on the held-out bytes, once per family."""
    made = {}

    def get(family: str) -> np.ndarray:
        if family not in made:
            folder = TRAINED[family].folder
            made[family] = hf.full_logits(folder, held_out_ids(folder)).numpy()
        return made[family]

    return get


@pytest.fixture(scope="module")
def family_bundles(bundles, export_fn):
    """A family's folder exported once per recipe (decode only; the export's gate on)."""
    made = {}

    def get(family: str, quant: str):
        if (family, quant) not in made:
            budget = {"size_budget": BUDGET} if quant == "auto" else {}
            made[family, quant] = export_fn(TRAINED[family].folder, bundles / f"{family}-{quant}", quant=quant,
                                            prefill_chunk=None, **budget)  # fmt: skip
        return made[family, quant]

    return get


@pytest.mark.parametrize("family", sorted(TRAINED))
def test_the_model_is_trained_and_routes_every_expert(references, family):
    t = TRAINED[family]
    ids = held_out_ids(t.folder)
    assert ids[:3] == [b + 1 for b in BUNDLED["rwkv7-pydoc"].validation_text.read_bytes()[:3]]
    assert mean_nats(references(family)[:-1], ids[1:]) < UNIGRAM_LOSS - 1  # far below the unigram baseline
    routing = mf.routed_experts(t.folder, ids, t.router_class)
    assert len(routing) == t.moe_layers
    seen = [len(set(chosen.flatten().tolist())) for chosen, _ in routing]  # experts each MoE layer chose
    assert seen == list(t.experts_seen or [8] * t.moe_layers)
    assert len({tuple(sorted(row)) for chosen, _ in routing for row in chosen.tolist()}) >= 20


def bundle_logits(path, ids: list[int]) -> np.ndarray:
    from ssmport.runtime import Runner

    with Runner(path) as runner:
        return runner.step_each(ids)


@pytest.mark.parametrize("quant", ["int8keepproj", "int4keepproj"])
@pytest.mark.parametrize("family", sorted(TRAINED))
def test_quantized_bundle_keeps_confident_top1_and_passes_its_gate(family_bundles, references, family, quant):
    t, bundle = TRAINED[family], family_bundles(family, quant)
    assert bundle.manifest.gate.passed and not bundle.manifest.gate.synthetic_weights
    ref = references(family)[:STEPS]
    assert_keeps_confident_top1(bundle_logits(bundle.path, held_out_ids(t.folder)[:STEPS]), ref, quant)
    stacks = [e for e in bundle.manifest.plan_tensors if e.get("rows_read")]
    assert len(stacks) == 2 * t.moe_layers and all(e["rows_read"] == 2 for e in stacks)  # gathered: 2 of 8 read
    # int8keepproj's experts are int8; int4keepproj's 4-bit only where the family measured them safe
    expected = "int4" if quant == "int4keepproj" and t.int4_experts else "int8"
    assert {e["dtype"] for e in stacks} == {expected}


@pytest.mark.parametrize("family", sorted(TRAINED))
def test_int4keepproj_asset_ratio_to_int8keepproj_is_the_measured_one(family_bundles, family):
    int4, int8 = (family_bundles(family, q).manifest.asset.bytes for q in ("int4keepproj", "int8keepproj"))
    assert int4 <= TRAINED[family].max_int4_ratio * int8


def test_auto_fits_its_budget_and_passes_its_gate(family_bundles):
    m = family_bundles("lfm2_moe", "auto").manifest
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


@pytest.mark.parametrize("family", sorted(TRAINED))
def test_committed_weights_are_fp16_safetensors(family):
    from safetensors import safe_open

    folder = TRAINED[family].folder
    with safe_open(folder / "model.safetensors", "pt") as f:
        assert {f.get_slice(n).get_dtype() for n in f.keys()} == {"F16"}
        assert any(".experts." in n or ".input_linear." in n for n in f.keys())
    assert (folder / "model.safetensors").stat().st_size < 4.2e6  # small enough to commit
