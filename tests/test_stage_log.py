"""What a long job writes to a stderr that is not a terminal (a CI log, nohup, a file):
a line once a stage has run a while, one per period after, one when it ends; nothing for a
quick stage, so a user error stays one line."""

from __future__ import annotations

import re
import time

import pytest

import ssmport.progress as progress
from ssmport.progress import Stages


@pytest.fixture
def fast_log(monkeypatch):
    monkeypatch.setattr(progress, "LOG_AFTER_S", 1.0)
    monkeypatch.setattr(progress, "LOG_EVERY_S", 1.0)


def _lines(capsys) -> list[str]:
    return [re.sub(r"^ssmport: \[\d\d:\d\d:\d\d\] ", "", line) for line in capsys.readouterr().err.splitlines()]


def test_a_long_stage_names_itself_counts_and_ends(fast_log, capsys):
    with Stages() as stages:
        with stages.stage("Quick"):
            pass
        with stages.stage("Gate (3 teacher-forced steps)", total=3):
            stages.advance()
            time.sleep(2.6)  # stands in for one long runtime call
            stages.advance(2)
    lines = _lines(capsys)
    assert lines[0] == "Gate (3 teacher-forced steps): 1 of 3 done, 1 s so far", lines
    assert lines[-1] == "Gate (3 teacher-forced steps): done after 3 s", lines
    assert 2 <= len(lines) <= 4 and not any("Quick" in line for line in lines), lines


def test_a_stage_stopped_by_an_error_says_so(fast_log, capsys):
    with pytest.raises(ValueError), Stages() as stages, stages.stage("Converting to Core AI"):
        time.sleep(1.6)
        raise ValueError
    assert _lines(capsys) == ["Converting to Core AI: 1 s so far", "Converting to Core AI: stopped after 2 s"]


def test_quiet_and_quick_leave_nothing(fast_log, capsys):
    with Stages(enabled=False) as stages, stages.stage("Writing asset"):
        time.sleep(1.6)
    with Stages() as stages, stages.stage("Reading checkpoint"):
        pass
    assert capsys.readouterr().err == ""


def test_counts_read_as_steps_or_a_percentage():
    assert progress._count(3.43, 8) == "3 of 8 done, "
    assert progress._count(1.219e9, 1.5274e9) == "80% done, "
    assert progress._count(0, 1) == progress._count(5, None) == ""
