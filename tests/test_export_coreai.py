"""Exported bundles, executed on the Core AI runtime, against independent references."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ir_checks import graph_texts, writes_per_state
from rwkv7_files import rwkv_package_logits
from ssmport.bundle import Bundle
from ssmport.errors import SsmportError
from ssmport.exporter.convert import convert
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.runtime import Runner
from ssmport.loader.resolve import load_checkpoint

TOKENS = [1, 45, 45, 300, 7, 0, 19, 222, 5, 5, 5, 128, 64, 2, 319, 11]


def coreai_logits(bundle_path, tokens) -> np.ndarray:
    with Runner(bundle_path) as runner:
        return runner.step_each(tokens)


def rel_err(ref, got) -> float:
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    return float(np.abs(ref - got).max() / max(1.0, np.abs(ref).max()))


def test_fp32_bundle_matches_blinkdl_package(pth_fp32_bundle, blinkdl_pth):
    ours = coreai_logits(pth_fp32_bundle.path, TOKENS)
    theirs = rwkv_package_logits(blinkdl_pth, TOKENS).numpy()
    assert ours.dtype == np.float32 and ours.shape == (len(TOKENS), 320)
    assert rel_err(theirs, ours) < 1e-4
    assert np.abs(theirs - ours).max() < 2e-3
    assert (theirs.argmax(-1) == ours.argmax(-1)).all()


def test_bf16_checkpoint_bundle_matches_package(blinkdl_bf16_pth, bundles, export_fn):
    result = export_fn(blinkdl_bf16_pth, bundles, quant="fp32", gate=False)
    ours = coreai_logits(result.path, TOKENS)
    theirs = rwkv_package_logits(blinkdl_bf16_pth, TOKENS).numpy()
    assert rel_err(theirs, ours) < 1e-4
    assert (theirs.argmax(-1) == ours.argmax(-1)).all()


def test_fla_sharded_folder_bundle_matches_package(fla_folder, blinkdl_pth, bundles, export_fn):
    result = export_fn(fla_folder, bundles, quant="fp32", gate=False)
    assert result.manifest.source["kind"] == "hf"
    ours = coreai_logits(result.path, TOKENS)
    theirs = rwkv_package_logits(blinkdl_pth, TOKENS).numpy()
    assert rel_err(theirs, ours) < 1e-4
    assert (theirs.argmax(-1) == ours.argmax(-1)).all()


def test_export_gate_recorded(pth_fp32_bundle):
    m = pth_fp32_bundle.manifest
    # 6 tokens: the first 3 as one prompt through prefill (one record), then 3 decode steps
    assert m.gate.passed and m.gate.steps == 4
    transcript = json.loads((pth_fp32_bundle.path / "gate.json").read_text())
    assert [(s["step"], s["via"]) for s in transcript["steps"]] == [(2, "prefill"), (3, "main"), (4, "main"), (5, "main")]
    assert transcript["summary"]["max_rel_logit_delta"] < 1e-4
    assert m.gate.functions == ["main", "prefill"] and m.gate.functions_not_run == []


def test_16bit_export_gate_runs_decode_only(pth_fp16_bundle, capsys):
    """A 16-bit bundle's export gate feeds every token through `main` (its padded prefill chunk
    costs this runtime as much as 64 decode calls), and the manifest, the CLI and inspect say so."""
    from ssmport.cli.main import main

    m = pth_fp16_bundle.manifest
    assert m.prefill is not None and m.gate.steps == 6
    transcript = json.loads((pth_fp16_bundle.path / "gate.json").read_text())
    assert [(s["step"], s["via"]) for s in transcript["steps"]] == [(t, "main") for t in range(6)]
    assert m.gate.functions == ["main"] and m.gate.functions_not_run == ["prefill"]
    assert pth_fp16_bundle.gate_headline.endswith("; the prefill function not run")
    assert main(["inspect", str(pth_fp16_bundle.path)]) == 0
    assert "the decode function only: prefill not run" in capsys.readouterr().out


def test_gate_prefill_runs_a_16bit_bundles_prefill(blinkdl_pth, bundles, capsys):
    from ssmport.cli.main import main

    export = ["export", str(blinkdl_pth), "--quant", "fp16", "--gate-steps", "4", "-q"]
    assert main([*export, "-o", str(bundles / "gate-default")]) == 0
    assert "gate: the decode function only; `ssmport gate " in capsys.readouterr().out
    out = bundles / "gate-prefill"
    assert main([*export, "--gate-prefill", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "gate: PASS fp16" in printed and "not run" not in printed and "decode function only" not in printed
    bundle = Bundle.open(next(out.iterdir()))
    transcript = json.loads((bundle.path / "gate.json").read_text())
    assert [(s["step"], s["via"]) for s in transcript["steps"]] == [(1, "prefill"), (2, "main"), (3, "main")]
    assert bundle.manifest.gate.functions == ["main", "prefill"] and bundle.manifest.gate.functions_not_run == []


def test_contract_names_order_shapes_dtypes(pth_fp32_bundle, dims):
    m = pth_fp32_bundle.manifest
    L, H, N, C = dims.layers, dims.width // dims.head, dims.head, dims.width
    assert [(t.name, list(t.shape), t.dtype) for t in m.main.inputs] == [
        ("input_ids", [1, 1], "int32"),
        ("position_ids", [1, 1], "int32"),
    ]
    assert [(t.name, list(t.shape), t.dtype) for t in m.states] == [
        ("recState", [L, 1, H, N, N], "float32"),
        ("shiftState", [L, 1, 2, C], "float32"),
    ]
    assert [(t.name, list(t.shape), t.dtype) for t in m.main.outputs] == [("logits", [1, 1, 320], "float32")]
    with Runner(pth_fp32_bundle.path) as runner:  # what the runtime itself reports
        d = runner._fn.desc
        assert list(d.input_names) == ["input_ids", "position_ids"]
        assert list(d.state_names) == ["recState", "shiftState"]
        assert list(d.output_names) == ["logits"]


@pytest.mark.parametrize("quant", ["fp32", "fp16"])
def test_each_state_written_once_in_ir(blinkdl_pth, quant):
    """Apple's GPU delegate keeps one write per state handle: count them in the IR of both
    functions (decode and prefill), at the top level."""
    model = load_checkpoint(blinkdl_pth)
    builder = WeightBuilder(get_recipe(quant), model.architecture.keeps_float)
    program = convert(model, builder, torch.float32, prefill_chunk=4).program
    assert list(graph_texts(program)) == ["main", "prefill"]
    for function in ("main", "prefill"):
        assert writes_per_state(program, function) == {"recState": 1, "shiftState": 1}
        assert writes_per_state(program, function, top_level_only=True) == {"recState": 1, "shiftState": 1}


def test_fp16_bundle_gated(pth_fp16_bundle, blinkdl_pth):
    m = pth_fp16_bundle.manifest
    assert m.gate.passed, m.gate
    assert m.main.outputs[0].dtype == "float16"
    assert {t.dtype for t in m.states} == {"float32"}
    ours = coreai_logits(pth_fp16_bundle.path, TOKENS)
    theirs = rwkv_package_logits(blinkdl_pth, TOKENS).numpy()
    assert rel_err(theirs, ours) < get_recipe("fp16").gate.max_rel_logit_delta
    assert 1e-4 < rel_err(theirs, ours)  # really fp16: not the fp32 graph by mistake


def test_runner_state_lifecycle(pth_fp32_bundle):
    with Runner(pth_fp32_bundle.path) as runner:
        assert all(not runner.state(n).any() for n in runner.state_names)
        first = runner.feed([5, 6, 7])
        assert runner.tokens == [5, 6, 7]
        assert runner.state("recState").any() and runner.state("shiftState").any()
        runner.reset()
        assert runner.tokens == [] and not runner.state("recState").any()
        again = runner.feed([5, 6, 7])
        np.testing.assert_array_equal(first, again)
        with pytest.raises(SsmportError, match="outside the vocabulary"):
            runner.step(320)


def test_second_load_uses_cached_lowering(pth_fp32_bundle):
    import time

    Runner(pth_fp32_bundle.path).close()  # ensure lowered
    start = time.perf_counter()
    runner = Runner(pth_fp32_bundle.path)
    elapsed = time.perf_counter() - start
    assert not runner.lowered_now
    runner.close()
    assert elapsed < 1.0


def test_existing_bundle_refused_without_overwrite(blinkdl_pth, pth_fp32_bundle, export_fn):
    before = (pth_fp32_bundle.path / "manifest.json").read_text()
    with pytest.raises(SsmportError, match="already exists"):
        export_fn(blinkdl_pth, pth_fp32_bundle.path.parent, quant="fp32", gate=False)
    assert (pth_fp32_bundle.path / "manifest.json").read_text() == before


def test_failed_export_leaves_nothing(tmp_path, export_fn, monkeypatch):
    import ssmport.exporter.pipeline as export_module

    def boom(*a, **k):
        raise RuntimeError("simulated converter crash")

    monkeypatch.setattr(export_module, "convert", boom)
    with pytest.raises(RuntimeError):
        export_fn("rwkv7-tiny", tmp_path, gate=False)
    assert list(tmp_path.iterdir()) == []


def test_bundle_open_rejects_non_bundles(tmp_path):
    with pytest.raises(SsmportError, match="not an ssmport bundle"):
        Bundle.open(tmp_path)


def test_unclosed_runner_does_not_abort_the_interpreter(pth_fp32_bundle):
    """A Runner left open used to SIGABRT at exit (Swift runtime, exit 134)."""
    import subprocess
    import sys

    code = f"from ssmport.runtime import Runner\nr = Runner({str(pth_fp32_bundle.path)!r})\nr.step(1)\nprint('ok')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    assert "exception" not in proc.stderr
