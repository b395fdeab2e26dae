"""The command line: contracts other tools rely on, and one clean line per user error."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from rwkv7_files import rwkv_package_logits
from ssmport.cli.main import main

TOKENS = [9, 8, 7, 300, 300, 1, 0, 42]


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_logits_contract(pth_fp32_bundle, blinkdl_pth, tmp_path, capsys):
    ids = tmp_path / "ids.txt"
    ids.write_text("9, 8,7\n300 300,1\n\n0 42\n")  # commas and/or whitespace
    out = tmp_path / "logits.npy"
    code, stdout, _ = run_cli(capsys, "logits", pth_fp32_bundle.path, "--tokens-file", ids, "--out", out)
    assert code == 0, stdout
    got = np.load(out)
    assert got.dtype == np.float32 and got.shape == (len(TOKENS), 320)
    ref = rwkv_package_logits(blinkdl_pth, TOKENS).numpy()
    assert np.abs(ref - got).max() < 2e-3
    assert (ref.argmax(-1) == got.argmax(-1)).all()

    torch_out = tmp_path / "torch.npy"
    code, _, _ = run_cli(capsys, "logits", pth_fp32_bundle.path, "--tokens-file", ids, "--out", torch_out,
                         "--backend", "torch")  # fmt: skip
    assert code == 0
    assert np.abs(np.load(torch_out) - got).max() < 1e-4


def test_generate_ids_inspect_list(pth_fp32_bundle, capsys):
    code, out, _ = run_cli(capsys, "generate", pth_fp32_bundle.path, "--tokens", "1,2,3", "-n", "5")
    assert code == 0
    ids = [int(x) for x in out.strip().split(",")]
    assert len(ids) == 5 and all(0 <= i < 320 for i in ids)
    code, out, _ = run_cli(capsys, "inspect", pth_fp32_bundle.path)
    assert code == 0
    for needle in ("recState", "shiftState", "input_ids", "position_ids", "logits", "gate: PASS", "analytic"):
        assert needle in out
    code, out, _ = run_cli(capsys, "list")
    assert code == 0 and "rwkv7-1.5b" in out and "rwkv7-tiny" in out
    code, out, _ = run_cli(capsys, "list", "--recipes")
    from ssmport.quant import RECIPES

    assert code == 0 and {"int8keepproj", "int4keepproj", "int4"} <= set(RECIPES)
    lines = out.splitlines()
    for name, recipe in RECIPES.items():  # each recipe, then its gate limits on the next line
        row = next(i for i, line in enumerate(lines) if line.startswith(f"{name} "))
        assert f"max |Δlogits| <= {recipe.gate.max_rel_logit_delta:g} x logit scale" in lines[row + 1]
        assert ("fp16 floor" in lines[row + 1]) == bool(recipe.gate.runtime_floor_factor)


def test_gate_command(scratch_bundle, tmp_path, capsys):
    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(map(str, TOKENS)))
    # the bundle has prefill: 4 tokens as one prompt (one record), then 4 decode steps
    code, out, _ = run_cli(capsys, "gate", scratch_bundle, "--tokens-file", ids)
    assert code == 0 and out.startswith("PASS fp32: top-1 5/5")
    code, out, _ = run_cli(capsys, "gate", scratch_bundle, "--prompts", 2, "--steps", 5, "--json")
    assert code == 0 and '"steps": 8' in out  # per stream: 2-token prompt + 3 steps


def test_a_decode_only_gate_skips_prefill_and_records_nothing(scratch_bundle, tmp_path, capsys):
    """--decode-only: all 8 tokens one at a time through `main` (8 records, not the 5 of a
    prompt through `prefill`); printed, and the bundle's recorded gate left as it was."""
    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(map(str, TOKENS)))
    before = {f: (scratch_bundle / f).read_bytes() for f in ("manifest.json", "gate.json")}
    code, out, _ = run_cli(capsys, "gate", scratch_bundle, "--tokens-file", ids, "--decode-only")
    assert code == 0 and out.startswith("PASS fp32: top-1 8/8"), out
    assert "not recorded in the bundle" in out and "transcript:" not in out
    assert {f: (scratch_bundle / f).read_bytes() for f in before} == before
    code, _, err = run_cli(capsys, "gate", scratch_bundle, "--decode-only", "--compare")
    assert code == 2 and err == "ssmport: error: --decode-only applies to the bundle's own gate, not to --compare\n"


def test_gate_against_other_weights_is_refused(scratch_bundle, blinkdl_bf16_pth, capsys):
    """--weights of another model (same shapes) is not the bundle's source: one line, exit 2
    (it used to gate against them, or give their logits)."""
    code, _, err = run_cli(capsys, "gate", scratch_bundle, "--weights", blinkdl_bf16_pth, "--prompts", 1, "--steps", 4)
    assert code == 2 and "holds other values (same shapes, other weights)" in err


def test_gate_fails_with_exit_1_when_the_bundle_misses_its_thresholds(pth_fp16_bundle, tmp_path, capsys):
    """The gate can fail: an fp16 bundle held to fp32's thresholds (its manifest relabelled)."""
    bundle = shutil.copytree(pth_fp16_bundle.path, tmp_path / "b")
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["recipe"]["name"] = "fp32"
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    code, out, _ = run_cli(capsys, "gate", bundle, "--prompts", 1, "--steps", 4)
    assert code == 1 and out.startswith("FAIL")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["export", "/no/such/model.pth"], "neither a preset"),
        (["export", "rwkv7-1.5b"], "BlinkDL/rwkv-7-world: not in the Hugging Face cache"),  # offline in the tests
        (["export", "gated-deltanet-1.3b"], "no download source: pass --weights PATH"),
        (["export", "rwkv7-tiny", "--weights", "x.pth", "--synthetic"], "not both"),
        (["gate", "/no/such/bundle"], "not a bundle directory"),
        (["inspect", "."], "not an ssmport bundle"),
        (["tokenize", "/no/vocab.txt", "--text", "hi"], "no such vocab file"),
        (["export", "rwkv7-tiny", "--quant", "int3"], "invalid choice: 'int3'"),
        (["export", "rwkv7-tiny", "--gate-steps", "0"], "--gate-steps must be at least 1"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_user_errors_are_one_line(capsys, argv, message):
    try:
        code, out, err = run_cli(capsys, *argv)
    except SystemExit as exc:  # argparse exits by itself
        code, (out, err) = exc.code, capsys.readouterr()
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("ssmport: error:") and message in err
    assert "Traceback" not in err + out


def test_bad_token_files(pth_fp32_bundle, tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    for text, message in (("1, 2, x3", "'x3' is not an integer"), ("1 320", "outside the vocabulary"),
                          ("", "no token ids")):  # fmt: skip
        bad.write_text(text)
        code, _, err = run_cli(capsys, "logits", pth_fp32_bundle.path, "--tokens-file", bad, "--out", tmp_path / "o.npy")
        assert code == 2 and message in err and err.count("\n") == 1
    assert not (tmp_path / "o.npy").exists()


def test_console_script_no_traceback_and_clean_exit(tmp_path):
    exe = shutil.which("ssmport") or str((__import__("pathlib").Path(sys.executable).parent / "ssmport"))
    bad = tmp_path / "bad.pth"
    bad.write_bytes(b"\x00" * 10)
    proc = subprocess.run([exe, "export", str(bad), "-o", str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("ssmport: error:") and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_bench_smoke(scratch_bundle, capsys):
    code, out, _ = run_cli(capsys, "bench", scratch_bundle, "--steps", 2, "--warmup", 1, "--torch", "--json")
    assert code == 0
    r = __import__("json").loads(out)
    for key in ("load_s_first", "load_s_cached", "decode_ms_per_token", "state_bytes", "asset_bytes",
                "weight_bytes_per_token", "effective_gb_per_s", "torch_ms_per_token_1thread"):  # fmt: skip
        assert r[key] > 0
    assert "prefill_tokens_per_s" in r
    assert r["load_s_cached"] < r["load_s_first"]
    code, out, _ = run_cli(capsys, "bench", scratch_bundle, "--steps", 2, "--no-roofline")
    assert code == 0 and "ms/token" in out and "roofline" not in out


def test_inspect_a_bundle_of_a_hand_built_model(capsys, tmp_path):
    """A LoadedModel built in code need give no more provenance than its `kind`
    (ssmport.architectures.Provenance); inspect once crashed with KeyError 'preset'."""
    import ssmport

    arch = ssmport.get_architecture("rwkv7")
    config = arch.config_from_json(dict(ssmport.presets()["rwkv7-tiny"].config))
    model = ssmport.LoadedModel(arch, config, arch.synthetic_weights(config, 3), {"kind": "synthetic"}, name="handmade")
    result = ssmport.export(model, tmp_path, gate=False, progress=False, prefill_chunk=None)
    code, out, err = run_cli(capsys, "inspect", str(result.path))
    assert code == 0, err
    assert "synthetic weights for a config given in code" in out
