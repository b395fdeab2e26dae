"""Runtime ops per call (ssmport.runtime.op_count): the kernels the Core AI runtime executes
for one decode call and one prefill chunk, checked against the ops of the program's own IR."""

from __future__ import annotations

import collections
import re

import pytest
import torch
from ir_checks import graph_texts

from ssmport.bench import bench_bundle
from ssmport.bundle import Bundle
from ssmport.cli.main import main as cli
from ssmport.exporter.convert import convert
from ssmport.exporter.pipeline import export
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.runtime.op_count import count_ops
from ssmport.loader.resolve import load_model

# IR ops that are not kernels: values, the state handles' plumbing, region terminators
NOT_KERNELS = {"constant", "yield", "create_token", "read_handle", "write_handle", "output"}
IR_OP = re.compile(r"^\s+(?:%\S+(?:, %\S+)* = )?\"?coreai\.(?:decomposable\.)?([\w.]+)", re.M)


@pytest.fixture(scope="module")
def gated_bundle(tmp_path_factory):
    return export("mamba2-tiny", tmp_path_factory.mktemp("ops"), quant="fp32", gate_steps=2, progress=False,
                  prefill_chunk=8)  # fmt: skip


def ir_kernels(text: str) -> collections.Counter:
    ops = collections.Counter(IR_OP.findall(text))
    for name in NOT_KERNELS:
        ops.pop(name, None)
    return ops


def test_the_count_is_the_programs_ops(gated_bundle):
    """Per op type, the runtime executes what the IR holds, except the casts the lowering folds
    away (fp32 to fp32 here)."""
    model = load_model("mamba2-tiny")
    program = convert(model, WeightBuilder(get_recipe("fp32"), model.architecture.keeps_float), torch.float32,
                      prefill_chunk=8).program  # fmt: skip
    counted = count_ops(Bundle.open(gated_bundle.path))
    for function, text in graph_texts(program).items():
        want = ir_kernels(text)
        got = collections.Counter(counted[function].by_type)
        got["broadcasting_where"] = got.pop("where", 0)  # the runtime's name for it
        assert got["cast"] <= want.pop("cast", 0)
        got.pop("cast", None)
        assert +got == +want, function
        assert counted[function].ops == sum(counted[function].by_type.values()) > 100


def test_recorded_at_export_shown_by_inspect_and_measured_by_bench(gated_bundle, capsys):
    recorded = gated_bundle.manifest.export["runtime_ops"]
    bundle = Bundle.open(gated_bundle.path)
    assert recorded == {f: c.to_json() for f, c in count_ops(bundle).items()}  # the same every time
    assert cli(["inspect", str(gated_bundle.path)]) == 0
    out = capsys.readouterr().out
    assert f"runtime ops: decode {recorded['main']['ops']} kernels per call, prefill {recorded['prefill']['ops']} per chunk" in out
    r = bench_bundle(bundle, steps=2, warmup=0, roofline=False, prefill_tokens=8)
    assert r["ops_per_decode_call"] == recorded["main"]["ops"]
    assert r["ops_per_prefill_chunk"] == recorded["prefill"]["ops"]


def test_a_bundle_without_the_gate_says_how_to_count(tmp_path, capsys):
    result = export("mamba2-tiny", tmp_path, quant="fp32", gate=False, progress=False, prefill_chunk=None)
    assert "runtime_ops" not in result.manifest.export
    cli(["inspect", str(result.path)])
    assert "not recorded" in capsys.readouterr().out
    cli(["inspect", str(result.path), "--count-ops"])
    assert re.search(r"runtime ops: decode \d+ kernels per call \(Core AI runtime Profiler, counted now", capsys.readouterr().out)


def test_export_counts_a_prefill_chunk_for_fp32_bundles_only(tmp_path, capsys):
    """A full chunk is minutes at 1B on this runtime's emulated int8/fp16: export skips it there."""
    result = export("mamba2-tiny", tmp_path, quant="int8keepproj", gate_steps=2, progress=False, prefill_chunk=8)
    recorded = result.manifest.export["runtime_ops"]
    assert set(recorded) == {"main"} and recorded["main"]["ops"] > 100
    cli(["inspect", str(result.path)])
    assert "prefill not counted at export (fp32 bundles only: --count-ops counts it)" in capsys.readouterr().out
    cli(["inspect", str(result.path), "--count-ops"])
    assert re.search(r"prefill \d+ per chunk \(Core AI runtime Profiler, counted now", capsys.readouterr().out)
