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
