"""The bundle layout as an object (ssmport.layout): read once from its name, then asked, never
compared by name outside ssmport/apple/."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from ssmport.apple.layout import AppleLayout
from ssmport.errors import SsmportError
from ssmport.layout import MAIN_CALL, PREFILL_CALL
from ssmport.layouts import DEFAULT, NAMES, SsmportLayout, layout_named
from ssmport.manifest import LAYOUTS

PACKAGE = Path(__file__).resolve().parents[1] / "ssmport"


def test_the_layouts_are_the_manifests():
    assert NAMES == LAYOUTS
    assert [layout_named(name).name for name in LAYOUTS] == list(LAYOUTS)
    assert isinstance(DEFAULT, SsmportLayout) and DEFAULT.name == "ssmport"


def test_a_layout_name_is_read_once_with_one_line_refusals():
    assert layout_named("apple", "chunk").main == "chunk" and layout_named("apple").main == "decode"
    assert layout_named(DEFAULT) is DEFAULT
    chunk = layout_named("apple", "chunk")
    assert layout_named(chunk, "chunk") is chunk  # as dataclasses.replace of an ExportOptions passes it
    with pytest.raises(SsmportError, match="--apple-main decode: the layout given is <layout apple, main chunk>"):
        layout_named(chunk, "decode")
    with pytest.raises(SsmportError, match="unknown --layout 'android'; choose one of: ssmport, apple"):
        layout_named("android")
    with pytest.raises(SsmportError, match="--apple-main applies to --layout apple only"):
        layout_named("ssmport", "chunk")
    with pytest.raises(SsmportError, match="unknown --apple-main 'big'"):
        layout_named("apple", "big")


def test_prompt_calls():
    tokens = list(range(1, 8))
    ssm, apple = SsmportLayout(), AppleLayout()
    # prefill: the ssmport layout sends everything through it, padded chunks of 3
    assert ssm.prompt_calls(tokens, 3, 1) == [(PREFILL_CALL, [1, 2, 3]), (PREFILL_CALL, [4, 5, 6]), (PREFILL_CALL, [7])]
    # the apple layout holds the last token back for `main`, as Apple's engines do
    assert apple.prompt_calls(tokens, 3, 1) == [(PREFILL_CALL, [1, 2, 3]), (PREFILL_CALL, [4, 5, 6]),
                                                (MAIN_CALL, [7])]  # fmt: skip
    assert apple.prompt_calls([5], 3, 1) == [(MAIN_CALL, [5])]
    # no prefill: `main` in calls of its rows
    assert ssm.prompt_calls(tokens[:3], None, 1) == [(MAIN_CALL, [1]), (MAIN_CALL, [2]), (MAIN_CALL, [3])]
    assert apple.prompt_calls(tokens, None, 4) == [(MAIN_CALL, [1, 2, 3, 4]), (MAIN_CALL, [5, 6, 7])]


def test_calling_conventions():
    ssm, apple = SsmportLayout(), AppleLayout()
    got = ssm.rows_inputs([7, 8], 5, 4)
    assert got["input_ids"].tolist() == [[7, 8, 0, 0]] and got["position_ids"].tolist() == [[5, 6, 7, 8]]
    assert got["valid_len"].tolist() == [2] and all(v.dtype == np.int32 for v in got.values())
    got = apple.rows_inputs([7, 8], 5, 4)
    assert set(got) == {"input_ids", "position_ids"} and got["input_ids"].tolist() == [[7, 8]]
    assert got["position_ids"].tolist() == [list(range(7))]
    assert ssm.main_positions(5, 1).tolist() == [5] and apple.main_positions(5, 2).tolist() == list(range(7))
    assert (ssm.padding, apple.padding, ssm.held_back, apple.held_back) == ("valid_len", "none", 0, 1)


def _name_comparisons(path: Path) -> list[int]:
    """Lines of `path` comparing a layout (an operand whose text names one) with a layout's name
    (a snapshot's "ssmport" metadata key is no layout)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            named = any(isinstance(o, ast.Constant) and o.value in LAYOUTS for o in operands)
            if named and any("layout" in ast.unparse(o) for o in operands):
                lines.append(node.lineno)
    return lines


def test_no_module_outside_apple_compares_a_layout_name():
    found = {str(p.relative_to(PACKAGE)): lines for p in sorted(PACKAGE.rglob("*.py"))
             if p.parent.name != "apple" and (lines := _name_comparisons(p))}  # fmt: skip
    assert found == {}


def test_the_scan_finds_a_comparison(tmp_path):
    (tmp_path / "m.py").write_text('def f(runner, layout, meta):\n    return runner.layout == "apple", '
                                   '"ssmport" != layout, "ssmport" in meta\n')
    assert _name_comparisons(tmp_path / "m.py") == [2, 2]
