"""Processes that used the Core AI runtime exit with status 0, every time.

Before ssmport.coreai_loop, ~1 run in 10 of these died at interpreter exit with SIGABRT
("C++ exception handling detected but the Swift runtime was compiled with exceptions
disabled"): the runtime's worker thread released Python objects while the interpreter was
finalizing. At that rate 20 clean runs in a row happen by chance about 1 time in 8.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

RUNS = 20
TWO_FUNCTIONS = """
import sys
from ssmport.runtime import Runner
first, second = Runner(sys.argv[1]), Runner(sys.argv[1])  # each loads `main` and `prefill`
first.feed(list(range(1, 12))); second.step(4); second.feed([5, 6])
"""  # neither runner is closed: the exit path must cope with that too


def _run_many(argv: list[str]) -> list[tuple[int, str]]:
    env = os.environ | {"PYTHONUNBUFFERED": "1"}

    def once(_):
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
        return proc.returncode, proc.stderr

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(once, range(RUNS)))


def _ssmport() -> str:
    return str(Path(sys.executable).parent / "ssmport")


def test_cli_on_a_multi_function_bundle_exits_0_every_time(multi_function_bundle, tmp_path):
    script = tmp_path / "chat.txt"
    script.write_text("Hello\nAnd then?\n/retry\n")
    results = _run_many([_ssmport(), "chat", str(multi_function_bundle), "--script", str(script), "-n", "3"])
    assert [code for code, _ in results] == [0] * RUNS, [err for code, err in results if code]
    assert not any("Swift runtime" in err or "Traceback" in err for _, err in results)


def test_two_functions_of_one_asset_loaded_at_once_exit_0_every_time(multi_function_bundle):
    results = _run_many([sys.executable, "-c", TWO_FUNCTIONS, str(multi_function_bundle)])
    assert [code for code, _ in results] == [0] * RUNS, [err for code, err in results if code]


def test_runtime_keeps_no_result_alive_after_a_step(multi_function_bundle):
    """The runtime's bridge keeps every call's asyncio Handle; the loop must make the handle
    let go of the future and its logits (else ~264 KB per step leak at vocab 65,536)."""
    import asyncio
    import gc

    from ssmport.coreai_loop import settle
    from ssmport.runtime import Runner

    def live_futures() -> int:
        assert settle(timeout=10)
        gc.collect()
        return sum(type(o) is asyncio.Future for o in gc.get_objects())

    with Runner(multi_function_bundle) as runner:
        runner.feed([1, 2])
        before = live_futures()
        runner.feed(list(range(3, 23)))
        assert live_futures() == before
