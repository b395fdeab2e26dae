"""One state type: ssmport.state.StateSpec is a manifest StateEntry with a torch dtype, so the
kinds, shapes and the dynamic-axis rule (ssmport.manifest.state_problem) are declared once and
a declared state and a recorded one refuse exactly the same things."""

import ast
from pathlib import Path

import pytest
import torch

from ssmport.errors import BundleError
from ssmport.manifest import DYNAMIC_DIM, FIXED, KINDS, KV, RING, StateEntry
from ssmport.state import StateSpec

ROOT = Path(__file__).resolve().parents[1] / "ssmport"

CASES = [  # (shape, kind, max_context, valid)
    ((2, 1, 4, 8), FIXED, None, True),
    ((2, 1, 2, 16, 8), KV, None, True),
    ((2, 1, 2, DYNAMIC_DIM, 8), KV, 64, True),
    ((2, 1, 2, 6, 8), RING, None, True),
    ((2, 1, 2, DYNAMIC_DIM, 8), KV, None, False),  # dynamic without its bound
    ((2, 1, 2, DYNAMIC_DIM, 8), KV, 0, False),
    ((2, 1, 2, 16, 8), KV, 64, False),  # a bound on a static axis
    ((2, DYNAMIC_DIM, 4), FIXED, 64, False),  # only a kv or ring state's position axis may be dynamic
    ((2, 1, 2, DYNAMIC_DIM, 8), RING, 64, True),  # a growing ring, up to its window (ssmport.growing_kv)
    ((2, 1, 2, DYNAMIC_DIM, 8), RING, None, False),
    ((2, 1, 6, 12), RING, None, False),
    ((2, 2, 2, 6, 8), RING, None, False),
    ((2, 1, 0, 6, 8), RING, None, False),
    ((2, 1, 16, 8), KV, None, False),
    ((2, 1, 4), "paged", None, False),
]


@pytest.mark.parametrize("shape, kind, max_context, valid", CASES)
def test_a_declared_and_a_recorded_state_meet_one_rule(shape, kind, max_context, valid):
    data = {"name": "s", "shape": list(shape), "dtype": "float32", "layout": "[axes]", "kind": kind}
    data |= {} if max_context is None else {"max_context": max_context}
    if valid:
        spec = StateSpec("s", shape, torch.float32, "[axes]", kind, max_context)
        entry = StateEntry.from_json(data, "m")
        assert spec.entry() == entry and spec.to_json() == data == entry.to_json()
        assert (spec.context, spec.window, spec.full_shape) == (entry.context, entry.window, entry.full_shape)
        assert spec.zeros().shape == entry.full_shape and -1 not in entry.full_shape
        return
    with pytest.raises(ValueError) as declared:
        StateSpec("s", shape, torch.float32, "[axes]", kind, max_context)
    with pytest.raises(BundleError) as recorded:
        StateEntry.from_json(data, "m")
    assert str(recorded.value) == f"m: {declared.value}"


def test_a_version_1_state_reads_as_fixed_with_no_legend():
    entry = StateEntry.from_json({"name": "recState", "shape": [2, 1, 4, 8, 8], "dtype": "float16"}, "m")
    assert (entry.kind, entry.axes, entry.context, entry.full_shape) == (FIXED, "", None, (2, 1, 4, 8, 8))


def test_state_kinds_are_compared_by_their_names():
    """`x.kind == "kv"` spelled as a literal drifts from ssmport.manifest's constants: every
    comparison of a `.kind` against a state kind in ssmport uses FIXED / KV / RING."""
    literal = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Attribute) and s.attr == "kind" for s in sides) and any(
                        isinstance(s, ast.Constant) and s.value in KINDS for s in sides):
                    literal.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
            if isinstance(node, ast.keyword) and node.arg == "kind" and isinstance(node.value, ast.Constant) \
                    and node.value.value in KINDS:
                literal.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    assert not literal, literal
