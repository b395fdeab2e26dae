"""A user error while stderr cannot take the line (on a full disk, or closed): still the
documented exit status 2 (it exited 1: the failed write of the error line raised, and Python's
own report of that failed too), and nothing written (issue 33)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("stderr", ["full", "closed"])
def test_a_user_error_with_stderr_unwritable_exits_2(tmp_path, stderr):
    sink = open("/dev/full", "w") if stderr == "full" else None  # noqa: SIM115 (closed below)
    try:
        proc = subprocess.run([sys.executable, "-m", "ssmport.cli.main", "export", str(tmp_path / "nosuch.pth"),
                               "-o", str(tmp_path / "out")],
                              stdout=subprocess.PIPE, stderr=sink, text=True, timeout=120,
                              preexec_fn=(lambda: os.close(2)) if stderr == "closed" else None)  # fmt: skip
    finally:
        if sink is not None:
            sink.close()
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert not (tmp_path / "out").exists()
