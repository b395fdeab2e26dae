"""benchmarks/ops_per_layer.py on mamba2-tiny: a layer's kernels by class add up to its ops, and
Mamba-2's decode layer runs four matmuls (in_proj, the conv's two row selections, out_proj):
its readout S.C is a product and a sum, not a matmul with one output column (ssmport.ops.ssd)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import ops_per_layer  # noqa: E402


def test_op_classes():
    assert ops_per_layer.by_class({"broadcasting_batch_matmul": 2, "reshape": 3, "exp": 1, "concat": -1, "if": 4}) == {
        "matmul": 2,
        "arithmetic": 1,
        "layout": 2,
        "control": 4,
    }


def test_mamba2_decode_layer_by_class(tmp_path):
    (row,) = ops_per_layer.measure("mamba2-tiny", tmp_path)
    classes, types = row["per_layer_classes"], row["per_layer_types"]
    assert sum(classes.values()) == row["per_layer"]["main"]
    assert classes["matmul"] == types["broadcasting_batch_matmul"] == 4
    assert types["reduce_sum"] >= 1
