"""The bad-input table of docs/errors.md: one test per row.

Every row runs the command line and expects exactly one line on stderr that starts with
`ssmport: error:` and names the problem, no traceback, a non-zero exit status, and no bundle
(partial or not) left in the output directory.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rwkv7_files import Dims, blinkdl_state_dict, fla_from_blinkdl, write_hf_folder, write_pth
from ssmport.bundle import staged_directory
from ssmport.cli.main import main
from ssmport.interrupts import interrupts_deferred


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse exits by itself
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line(code, out, err, message, exit_code=2):
    assert code == exit_code, (code, err)
    assert err.count("\n") == 1 and err.startswith("ssmport: error:"), err
    assert message in err, err
    assert "Traceback" not in err + out


def assert_no_bundle(out_dir: Path):
    assert not out_dir.exists() or not any(out_dir.iterdir()), list(out_dir.iterdir())


def export_fails(capsys, tmp_path, model, message, *extra):
    out = tmp_path / "out"
    assert_one_line(*run_cli(capsys, "export", model, "-o", out, "--quant", "fp32", "-q", *extra), message)
    assert_no_bundle(out)


# --- checkpoints ---------------------------------------------------------------------------
def test_truncated_pth(blinkdl_pth, tmp_path, capsys):
    bad = tmp_path / "cut.pth"
    bad.write_bytes(blinkdl_pth.read_bytes()[: blinkdl_pth.stat().st_size // 2])
    export_fails(capsys, tmp_path, bad, "not a loadable PyTorch checkpoint")


def test_truncated_safetensors(fla_folder, tmp_path, capsys):
    folder = shutil.copytree(fla_folder, tmp_path / "hf")
    shard = sorted(folder.glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-100])
    export_fails(capsys, tmp_path, folder, "not a readable safetensors file")


def test_not_a_checkpoint(tmp_path, capsys):
    bad = tmp_path / "notes.pth"
    bad.write_text("just some text\n")
    export_fails(capsys, tmp_path, bad, "not a loadable PyTorch checkpoint")


class _Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_pickle_refused_by_weights_only(tmp_path, capsys):
    bad = tmp_path / "evil.pth"
    torch.save({"emb.weight": torch.zeros(2, 2), "x": _Payload()}, bad)
    export_fails(capsys, tmp_path, bad, "not a loadable PyTorch checkpoint")


@pytest.mark.parametrize(
    "edit, message",
    [
        ("missing", "missing 1: blocks.1.ffn.key.weight"),
        ("extra", "unexpected 1: blocks.0.att.surplus"),
        ("misshaped", "misshaped 1: blocks.1.att.key.weight [128, 64]"),
    ],
)
def test_missing_extra_misshaped_keys(tmp_path, capsys, edit, message):
    sd = blinkdl_state_dict(Dims(), seed=3)
    if edit == "missing":
        del sd["blocks.1.ffn.key.weight"]
    elif edit == "extra":
        sd["blocks.0.att.surplus"] = torch.zeros(3)
    else:
        sd["blocks.1.att.key.weight"] = torch.zeros(128, 64)
    export_fails(capsys, tmp_path, write_pth(tmp_path / f"{edit}.pth", sd), message)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_inf_weights_are_refused(tmp_path, capsys, value):
    sd = blinkdl_state_dict(Dims(), seed=3)
    sd["blocks.1.att.value.weight"][3, 5] = value
    export_fails(capsys, tmp_path, write_pth(tmp_path / "nan.pth", sd), "blocks.1.att.value.weight contains NaN or Inf")


def test_unknown_preset(tmp_path, capsys):
    export_fails(capsys, tmp_path, "rwkv9-7b", "neither a preset")


def test_unknown_architecture(tmp_path, capsys):
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    export_fails(capsys, tmp_path, folder, "model_type 'llama' is not supported")


def test_config_disagrees_with_tensors(tmp_path, capsys):
    config, tensors = fla_from_blinkdl(blinkdl_state_dict(Dims(), seed=3), Dims())
    folder = write_hf_folder(tmp_path / "hf", config | {"hidden_size": 256}, tensors)
    export_fails(capsys, tmp_path, folder, "misshaped")


# --- the output path -----------------------------------------------------------------------
def test_output_bundle_exists(tmp_path, capsys):
    out = tmp_path / "out"
    (out / "rwkv7-tiny-fp32").mkdir(parents=True)
    code, o, err = run_cli(capsys, "export", "rwkv7-tiny", "-o", out, "-q")
    assert_one_line(code, o, err, "already exists (pass --overwrite")
    assert [p.name for p in out.iterdir()] == ["rwkv7-tiny-fp32"]


def test_output_path_is_a_file(tmp_path, capsys):
    out = tmp_path / "file"
    out.write_text("x")
    assert_one_line(*run_cli(capsys, "export", "rwkv7-tiny", "-o", out, "-q"), "is not a directory")
    assert out.read_text() == "x"


def test_output_path_not_writable(tmp_path, capsys):
    # /proc refuses new directories even to root (chmod would not stop root).
    assert_one_line(*run_cli(capsys, "export", "rwkv7-tiny", "-o", "/proc/ssmport-out", "-q"), "cannot write")


def test_disk_full_during_export(tmp_path, capsys, monkeypatch):
    """Simulated: the asset write fails with ENOSPC half-way through."""
    import ssmport.exporter as exporter

    def full(model, out):
        (out / "tokenizer").mkdir()
        (out / "tokenizer" / "half.tsv").write_bytes(b"x" * 100)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(exporter, "_write_tokenizer", full)
    out = tmp_path / "out"
    assert_one_line(*run_cli(capsys, "export", "rwkv7-tiny", "-o", out, "-q", "--no-gate"), "No space left on device")
    assert_no_bundle(out)


# --- bundles -------------------------------------------------------------------------------
def _copy(bundle_path: Path, tmp_path: Path) -> Path:
    return shutil.copytree(bundle_path, tmp_path / bundle_path.name)


def test_corrupt_manifest(pth_fp32_bundle, tmp_path, capsys):
    b = _copy(pth_fp32_bundle.path, tmp_path)
    (b / "manifest.json").write_text('{"format": "ssmport-bundle", ')
    assert_one_line(*run_cli(capsys, "generate", b, "--tokens", "1,2"), "unreadable manifest")


def test_missing_asset(pth_fp32_bundle, tmp_path, capsys):
    b = _copy(pth_fp32_bundle.path, tmp_path)
    shutil.rmtree(b / "model.aimodel")
    assert_one_line(*run_cli(capsys, "generate", b, "--tokens", "1,2"), "bundle is incomplete (no model.aimodel/)")


def test_damaged_asset(pth_fp32_bundle, tmp_path, capsys):
    b = _copy(pth_fp32_bundle.path, tmp_path)
    for f in (b / "model.aimodel").rglob("*"):
        if f.is_file():
            f.write_bytes(b"")
    manifest = json.loads((b / "manifest.json").read_text())
    manifest["bundle_id"] = "d" * 32  # not the lowered copy cached for the original
    (b / "manifest.json").write_text(json.dumps(manifest))
    assert_one_line(*run_cli(capsys, "generate", b, "--tokens", "1,2"), "not a loadable Core AI asset")


def test_missing_tokenizer_file(multi_function_bundle, tmp_path, capsys):
    b = _copy(multi_function_bundle, tmp_path)
    (b / "tokenizer" / "vocab.tsv").unlink()
    assert_one_line(*run_cli(capsys, "generate", b, "--prompt", "Hi"), "vocab.tsv")


# --- runner input --------------------------------------------------------------------------
def test_wrong_state_handed_to_the_runner(tmp_path, capsys, multi_function_bundle):
    """A saved state whose dtype does not match the bundle's (see also tests/test_session.py)."""
    import numpy as np

    from ssmport.runtime import Runner

    with Runner(multi_function_bundle) as r:
        snap = r.snapshot()
    states = {n: a.astype(np.float16) for n, a in snap.states.items()}
    path = type(snap)(snap.bundle_id, snap.architecture, states, snap.tokens).save(tmp_path / "s.safetensors")
    script = tmp_path / "chat.txt"
    script.write_text("hi\n")
    code, out, err = run_cli(capsys, "chat", multi_function_bundle, "--script", script, "--state", path)
    assert_one_line(code, out, err, "the bundle's are")


def test_token_ids_out_of_range(pth_fp32_bundle, capsys):
    assert_one_line(*run_cli(capsys, "generate", pth_fp32_bundle.path, "--tokens", "1,320"), "outside the vocabulary")


def test_empty_prompt(multi_function_bundle, capsys):
    assert_one_line(*run_cli(capsys, "generate", multi_function_bundle, "--prompt", ""), "no token ids given")


def test_invalid_utf8_in_a_text_file(multi_function_bundle, tmp_path, capsys):
    script = tmp_path / "chat.txt"
    script.write_bytes(b"hello \xff\xfe there\n")
    assert_one_line(*run_cli(capsys, "chat", multi_function_bundle, "--script", script), "not valid UTF-8")


# --- interruption --------------------------------------------------------------------------
def test_ctrl_c_during_export(tmp_path):
    out = tmp_path / "out"
    exe = str(Path(sys.executable).parent / "ssmport")
    proc = subprocess.Popen(
        [exe, "export", "rwkv7-tiny", "-o", str(out), "-q"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a shell's background job ignores it
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while not (out.exists() and any(out.iterdir())) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # until the export is writing its staging directory
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err
    assert err == "ssmport: interrupted\n"
    assert_no_bundle(out)


@pytest.fixture
def python_sigint_handler():
    """Python's own SIGINT handler, whatever this process inherited: a shell's background job
    starts with SIGINT ignored, and then there is no Ctrl-C to defer."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_during_export_is_deferred_to_a_safe_point(tmp_path, python_sigint_handler):
    # Raised where it lands, it was lost in torch.export's GC callbacks or aborted in its C++
    # callbacks; recorded, it stops the export at the next safe point, here the final rename.
    final = tmp_path / "out" / "bundle"
    went_on = False
    with pytest.raises(KeyboardInterrupt), interrupts_deferred():
        with staged_directory(final, overwrite=False) as staging:
            os.kill(os.getpid(), signal.SIGINT)
            (staging / "manifest.json").write_text("{}")
            went_on = True
    assert went_on
    assert_no_bundle(final.parent)


def test_a_second_ctrl_c_stops_at_once(python_sigint_handler):
    with pytest.raises(KeyboardInterrupt), interrupts_deferred():
        os.kill(os.getpid(), signal.SIGINT)
        reached = True
        os.kill(os.getpid(), signal.SIGINT)
        reached = False
    assert reached
