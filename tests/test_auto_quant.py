"""`--quant auto --size-budget SIZE` on trained weights (the shipped rwkv7-pydoc): the bundle fits
its budget (the asset's bytes on disk), its plan is what auto counted and chose, it passes its
gate, and `inspect` shows the sensitivity table; a budget below the smallest bundle, a bad SIZE
and a budget without auto are one line each. The greedy choice is checked on hand-made groups."""

from __future__ import annotations

import pytest
import torch

from ssmport.bundle import Bundle
from ssmport.cli.main import main
from ssmport.loader.resolve import load_model
from ssmport.quant.auto import FORMS, TABLE_FORMS, _choose, _Group, plan_auto
from ssmport.quant import get_recipe
from ssmport.quant.budget import parse_size

BUDGET = "3.5MB"  # between int4keepproj's plan (2.95 MB) and int8keepproj's (5.28 MB)


@pytest.fixture(scope="module")
def auto_bundle(bundles, export_fn):
    return export_fn("rwkv7-pydoc", bundles / "auto", quant="auto", size_budget=BUDGET, prefill_chunk=None)


def test_auto_fits_its_budget_and_passes_its_gate(auto_bundle):
    m = Bundle.open(auto_bundle.path).manifest
    auto, budget = m.plan["auto"], parse_size(BUDGET)
    assert m.recipe.name == "auto" and auto["budget_bytes"] == budget
    assert m.asset.bytes <= budget  # the asset as written, graph included
    assert m.plan["summary"]["total"] == auto["plan_bytes"] <= budget - auto["reserved_for_graph_bytes"]
    assert m.gate.passed
    # every candidate measured at every form; the plan stores each as the table chose
    rows = {g["group"]: g for g in auto["sensitivity"]}
    assert auto["granularity"] == "tensor" and all(set(g["mse"]) == set(FORMS) for g in rows.values())
    integer = [e for e in m.plan_tensors if e["block"]]
    assert integer and all(rows[e["name"]]["chosen"] == e["dtype"] for e in integer)
    # the budget lies below every-matmul-int8: auto had to lower some tensors to 4 bits
    assert {"int8", "int4"} <= set(m.plan["summary"]["by_dtype"])
    # every matmul at int4 would leave room for a 16-bit embedding: it is not lowered
    (emb,) = [e for e in m.plan_tensors if e["role"] == "embedding"]
    assert emb["dtype"] == "float16" and emb["name"] not in rows


def test_a_budget_only_an_integer_table_meets_lowers_the_embedding(bundles, export_fn):
    """2.6 MB lies below every matmul int4 with a 16-bit embedding (2.63 MiB): the embedding
    becomes a candidate, stored by row as chosen, and the bundle (run by the gate) fits."""
    b = export_fn("rwkv7-pydoc", bundles / "auto-table", quant="auto", size_budget="2.6MB", prefill_chunk=None)
    m = Bundle.open(b.path).manifest
    auto = m.plan["auto"]
    rows = {g["group"]: g for g in auto["sensitivity"]}
    (emb,) = [e for e in m.plan_tensors if e["role"] == "embedding"]
    assert emb["dtype"] == rows[emb["name"]]["chosen"] in ("int8", "int4") and emb["block"] == 32
    assert set(rows[emb["name"]]["mse"]) == set(TABLE_FORMS)
    assert m.asset.bytes <= parse_size("2.6MB")
    # the Core AI runtime's logits stay within the recipe's limit of the fp32 reference (its
    # top-1 verdict at this budget, nearly every matmul int4, is the gate's to report)
    assert m.gate.max_rel_logit_delta <= get_recipe("auto").gate.max_rel_logit_delta


def test_inspect_shows_the_choice_and_the_sensitivity_table(auto_bundle, capsys):
    assert main(["inspect", str(auto_bundle.path)]) == 0
    out = capsys.readouterr().out
    assert "auto: budget 3.5 MB" in out and "chosen per tensor" in out
    row = next(line for line in out.splitlines() if line.strip().startswith("head.weight"))
    assert len(row.split()) == 3 + 1 + len(FORMS)  # name, choice, bytes (value unit), one mse per form


@pytest.mark.parametrize("argv, says", [
    (["--quant", "auto", "--size-budget", "1MB"], "below the smallest rwkv7-pydoc bundle auto can make: 2,639,872 bytes"),
    (["--quant", "auto", "--size-budget", "3.5XB"], "--size-budget '3.5XB' is not a size"),
    (["--quant", "auto"], "--quant auto needs --size-budget SIZE"),
    (["--quant", "int8keepproj", "--size-budget", "3MB"], "--size-budget applies to --quant auto only"),
])  # fmt: skip
def test_budget_errors_are_one_line(tmp_path, capsys, argv, says):
    assert main(["export", "rwkv7-pydoc", "-o", str(tmp_path), "-q", *argv]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert not any(tmp_path.iterdir())  # no partial bundle


def test_list_recipes_shows_auto_with_its_gate(capsys):
    assert main(["list", "--recipes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("auto "))
    assert "--size-budget" in lines[i] and "max |Δlogits| <= 0.3 x logit scale" in lines[i + 1]


def _group(name: str, mse: dict[str, float], n: int = 1024) -> _Group:
    g = _Group(name, "ffn", [], ("float16", "int8", "uint4", "int4"))
    g.bytes = {"float16": 2 * n, "int8": n + n // 16, "uint4": n // 2 + n // 16 + n // 64, "int4": n // 2 + n // 16}
    g.mse = mse
    return g


def test_choice_lowers_the_cheapest_error_per_byte_first_and_fits():
    robust = _group("a", {"float16": 0.0, "int8": 1e-6, "uint4": 1e-4, "int4": 2e-4})
    fragile = _group("b", {"float16": 0.0, "int8": 1e-3, "uint4": 1e-1, "int4": 2e-1})
    groups = [fragile, robust]
    full = sum(g.bytes["float16"] for g in groups)
    assert _choose(groups, full) == {"a": "float16", "b": "float16"}  # room for everything: nothing lowered
    room = robust.bytes["int4"] + fragile.bytes["int8"]
    assert _choose(groups, room) == {"a": "int4", "b": "int8"}  # the robust one goes to 4 bits
    assert _choose(groups, room) == _choose(list(reversed(groups)), room)  # order does not matter
    tight = sum(g.bytes["int4"] for g in groups)
    assert _choose(groups, tight) == {"a": "int4", "b": "int4"}  # zero points measured, not chosen


class _Stop(Exception):
    pass


def test_calibration_runs_on_the_threads_asked_and_restores_the_callers():
    model = load_model("rwkv7-pydoc")
    seen = []

    def stop_after_first_pass():
        seen.append(torch.get_num_threads())
        raise _Stop

    caller = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(_Stop):
            plan_auto(model, parse_size(BUDGET), on_pass=stop_after_first_pass, threads=1)
        assert seen == [1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(caller)


def test_a_tied_head_and_table_are_one_choice_with_the_table_read_from_the_int8_head():
    """The head [C, V] and table [V, C] of n values: the shared form costs the int8 head alone
    (n + n/16 bytes, one fp16 scale per 32) against n + n/8 for both at int4, with the error of
    both at int8; `_choose` takes it where it fits, and leaves both 16-bit where there is room."""
    from ssmport.quant.auto import SHARED, _choose_with_tied

    n = 4096
    head = _group("head", {"float16": 0.0, "int8": 1e-5, "uint4": 1e-2, "int4": 2e-2}, n)
    table = _Group("table", "embedding", [], TABLE_FORMS)
    table.bytes = {"float16": 2 * n, "int8": n + n // 16, "int4": n // 2 + n // 16}
    table.mse = {"float16": 0.0, "int8": 1e-3, "int4": 1e-1}
    table.max_rel = {"float16": 0.0, "int8": 0.01, "int4": 0.1}
    other = _group("ffn", {"float16": 0.0, "int8": 1e-4, "uint4": 1e-2, "int4": 2e-2})
    groups = [head, other, table]
    room = n + n // 16 + other.bytes["int4"]  # below the head and table both at int4 (n + n / 8)
    choice = _choose_with_tied(groups, room, (head, table))
    assert choice == {"head": "int8", "table": SHARED, "ffn": "int4"}
    assert (table.bytes[SHARED], table.mse[SHARED]) == (0, table.mse["int8"])  # its row: no bytes, int8's error
    assert _choose_with_tied(groups, sum(g.bytes["float16"] for g in groups), (head, table)) == {
        "head": "float16", "table": "float16", "ffn": "float16"}  # fmt: skip
