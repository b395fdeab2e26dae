"""Issue 33's internal errors and misleading lines, each checked where it is decided.

(The bad-input table, tests/bad_inputs.py, holds those that are one command line each.)
"""

from __future__ import annotations

import time

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
