"""Issue 33's internal errors and misleading lines, each checked where it is decided.

(The bad-input table, tests/bad_inputs.py, holds those that are one command line each.)
"""

from __future__ import annotations

import contextlib
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ssmport.errors import SsmportError


# --- chat templates come from checkpoints and bundles: their work is bounded ------------------
@pytest.mark.parametrize(
    "template, what",
    [
        ("{% include 'other.jinja' %}", "TypeError"),  # no loader: was a TypeError (exit 70)
        ("{% for i in range(10000000000) %}{% endfor %}", "OverflowError"),
        ("{{ 'x' * 4000000000 }}", "too large"),  # 23 s and 4 GB, then MemoryError
        ("{% set n = 1000000000 %}{{ (2 ** n) > 1 }}", "too large"),
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError"),
        ("{% for i in range(100000) %}{{ 'y' * 100000 }}{% endfor %}", "characters"),
        ("{% set r = range(100000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}", "more than"),
    ],
)
def test_a_hostile_chat_template_is_one_line_in_bounded_time(template, what):
    from ssmport.tokenizers.chat_template import MAX_TEMPLATE_SECONDS, turn_pieces

    started = time.monotonic()
    with pytest.raises(SsmportError) as err:
        turn_pieces(template, {}, "tokenizer_config.json")
    assert time.monotonic() - started < MAX_TEMPLATE_SECONDS + 3
    message = str(err.value)
    assert "\n" not in message and message.startswith("tokenizer_config.json: the chat template does not render")
    assert what in message, message


def test_a_closed_runner_refuses_in_one_line(pth_fp32_bundle):
    """Runner.feed() after close() was an AttributeError ('_prefill')."""
    from ssmport.runtime import Runner

    runner = Runner(pth_fp32_bundle.path)
    runner.close()
    for call in (lambda: runner.feed([1, 2]), lambda: runner.step(1), lambda: runner.state(runner.bundle.manifest.states[0].name)):
        with pytest.raises(SsmportError, match="this Runner is closed"):
            call()


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_a_stdout_that_cannot_encode_the_text_gets_replacements(command, world_bundle, tmp_path, monkeypatch, capsys):
    """PYTHONIOENCODING=ascii or a Latin-1 pipe: UnicodeEncodeError (exit 70) from the echo of
    the prompt; now the characters it cannot encode are shown as '?'."""
    import io
    import sys

    from ssmport.cli.main import main

    script = tmp_path / "script.txt"
    script.write_text("héllo ☃\n/quit\n")
    text_bundle = world_bundle["bundle"]
    argv = {"generate": ["generate", text_bundle, "--prompt", "héllo ☃", "-n", "2"],
            "chat": ["chat", text_bundle, "--script", script, "-n", "2"]}[command]  # fmt: skip
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="latin-1"))
    code = main([str(a) for a in argv])
    sys.stdout.flush()
    assert code == 0, capsys.readouterr().err
    assert "h\xe9llo ?" in raw.getvalue().decode("latin-1")


# --- a full disk or a file-size limit during the asset's write -------------------------------
def _export_in_child(pth, out, preexec=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ssmport.cli.main", "export", str(pth), "-o", str(out), "-q", "--no-gate"],
                          capture_output=True, text=True, preexec_fn=preexec, timeout=300)  # fmt: skip


def _limit_file_size():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, resource.RLIM_INFINITY))  # below the 0.8 MB asset


def _assert_nothing_left(proc, out: Path, message: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("ssmport: error:") and message in proc.stderr, proc.stderr
    assert not out.exists() or list(out.iterdir()) == [], sorted(out.iterdir())


def test_an_export_under_a_file_size_limit_is_one_line_and_leaves_nothing(world_bundle, tmp_path):
    """`ulimit -f`: LLVM's writer ended the process (exit 1, no error line) and left the
    staging folder, the lock and the -o folders."""
    out = tmp_path / "a" / "b"
    proc = _export_in_child(world_bundle["pth"], out, _limit_file_size)
    _assert_nothing_left(proc, out, "the file-size limit (ulimit -f) is 0.3 MB")
    assert not (tmp_path / "a").exists()


def test_an_export_onto_a_full_disk_is_one_line_and_leaves_nothing(world_bundle, tmp_path):
    with _small_tmpfs(tmp_path / "small-disk", "512k") as mnt:
        proc = _export_in_child(world_bundle["pth"], mnt / "out")
        _assert_nothing_left(proc, mnt, "free on its disk, and the asset needs about")


@contextlib.contextmanager
def _small_tmpfs(mnt: Path, size: str):
    """A tmpfs of `size` at `mnt` (root only; the test is skipped where mounting is refused)."""
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.decode().strip()})")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_a_full_cache_disk_is_named_not_blamed_on_the_bundle(world_bundle, tmp_path, monkeypatch, capsys):
    """SSMPORT_CACHE on a full disk read as "the runtime crashed reading it (SIGBUS)"."""
    from ssmport.cli.main import main

    with _small_tmpfs(tmp_path / "small-cache", "64k") as mnt:
        monkeypatch.setenv("SSMPORT_CACHE", str(mnt))
        code = main(["generate", str(world_bundle["bundle"]), "--tokens", "1,2", "-n", "1"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert f"{mnt}/lowered: " in err and "free on its disk" in err and "(SSMPORT_CACHE)" in err, err


def test_chat_on_the_embedded_default_continues_the_text(tmp_path, capsys):
    """rwkv7-pydoc (a docs model, not a chat model) replied with nothing to every line under
    the World chat format: its first token was the blank line that ends a reply."""
    from ssmport.cli.main import main
    from ssmport.exporter.pipeline import export

    bundle = export("rwkv7-pydoc", tmp_path, quant="fp32", gate=False, progress=False).path
    script = tmp_path / "script.txt"
    script.write_text("The json module\n")
    code = main(["chat", str(bundle), "--script", str(script), "-n", "24", "--stats"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "[rwkv7-pydoc was trained on plain text, not on a chat format: it continues your text]" in err
    assert err.count("it continues your text") == 1
    reply = out.split("> The json module\n", 1)[1]
    assert len(reply.strip()) > 0 and "reply 24 tokens, ended by max tokens" in err, (reply, err)


def test_inspect_json_is_standard_json_when_the_gate_recorded_nan(world_bundle, tmp_path, capsys):
    """A gate over overflowing logits records NaN; `inspect --json` printed it as bare NaN."""
    import json
    import shutil

    from ssmport.cli.main import main

    bundle = shutil.copytree(world_bundle["bundle"], tmp_path / "b")
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["gate"]["max_abs_logit_delta"] = float("nan")
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    assert main(["inspect", "--json", str(bundle)]) == 0
    printed = json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(f"bare {name} printed"))
    assert printed["gate"]["max_abs_logit_delta"] is None
