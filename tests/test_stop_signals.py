"""Stop signals honoured where waiting for a safe point would mean waiting for a long call:
the lowering of the export's gate runs in a child process, which is killed (issue 33: SIGTERM
during the gate was honoured 24-46 s later). The Hub's blocked read is in test_hub.py."""

from __future__ import annotations

import os
import time

from test_errors import assert_no_bundle, run_cli

# The lowering child tells its parent to stop, then takes long (a large model's lowering).
_SLOW_LOWERING = """
import os, signal, sys, time
from pathlib import Path
Path(sys.argv[2]).parent.parent.joinpath("child.pid").write_text(str(os.getpid()))
os.kill(os.getppid(), signal.SIGTERM)
time.sleep(30)
"""


def test_sigterm_while_the_gate_lowers_kills_the_child_and_leaves_nothing(blinkdl_pth, tmp_path, capsys, monkeypatch,
                                                                           terminal_signals):  # fmt: skip
    import ssmport.runtime.lowering as lowering

    monkeypatch.setattr(lowering, "_LOWER", _SLOW_LOWERING)
    # A cache of its own: bundles are byte-identical now, so an earlier test's export of the
    # same checkpoint would leave a lowered entry here and the gate would not lower at all.
    monkeypatch.setenv("SSMPORT_CACHE", str(tmp_path / "cache"))
    code, out, err = run_cli(capsys, "export", blinkdl_pth, "-o", tmp_path / "out", "--quant", "fp32", "-q",
                             "--gate-steps", "2", "--no-prefill")  # fmt: skip
    ended = time.time()
    assert (code, err) == (143, "ssmport: terminated (SIGTERM)\n")
    lowered = lowering.cache_dir("lowered")
    assert ended - (lowered / "child.pid").stat().st_mtime < 10  # not the child's 30 s
    assert_no_bundle(tmp_path / "out")
    pid = int((lowered / "child.pid").read_text())
    assert [p.name for p in lowered.iterdir()] == ["child.pid"]  # no staging folder left
    time.sleep(0.2)
    try:
        os.kill(pid, 0)
        alive = not open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] == "Z"
    except ProcessLookupError:
        alive = False
    assert not alive, "the lowering child was left running"
