"""Every case of the bad-input table (tests/bad_inputs.py), run through the command line.

For each case: exactly one line on stderr, `ssmport: error: ...` naming the problem; the
documented exit status; no traceback and no "internal error" line; no output on stdout that
looks like a result; and every file in the watched trees (the case's own folder, the shared
checkpoints and bundles) byte for byte as it was, nothing added, nothing removed.

Cases run in this process through `ssmport.cli.main.main([...])`, except those that need a
real process of their own (a closed or full stdout, a runtime that may crash).
"""

from __future__ import annotations

import hashlib
import io
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bad_inputs import CASES, Env, markdown
import recurrent_gemma_files
from gdn_files import GDNDims, write_gdn_folder
from lfm3_files import write_lfm3
from mamba2_files import Geometry, write_transformers_folder
from moe_files import write_lfm2_moe, write_nemotron_moe
from rwkv6_files import Dims as RWKV6Dims
from rwkv6_files import blinkdl_state_dict as rwkv6_state_dict
from rwkv6_files import write_pth as write_rwkv6_pth
from rwkv7_files import Dims, blinkdl_state_dict, fla_from_blinkdl, write_hf_folder, write_pth
from ssmport.cli.main import INTERNAL_ERROR, main

CASE_SECONDS = 60  # a case that runs longer is unbounded work on bad input


def small_world_vocab() -> str:
    """A World vocab for 320 rows: the 256 single bytes and 63 common words (ids 1..319)."""
    words = [w.encode() for w in (" the", " a", " of", " and", " to", " in", " is", " that", " it", " for", "Hello", " world",
             " you", " on", " with", " as", " was", " be", " at", " by", " this", " have", " from", " or", " one", " had",
             " not", " but", " what", " all", " were", " we", " when", " your", " can", " said", " there", " use", " an",
             " each", " which", " she", " do", " how", " their", " if", " will", " up", " other", " about", " out", " many",
             " then", " them", " these", " so", " some", " her", " would", " make", " like", " him", " into")]  # fmt: skip
    tokens = [bytes([b]) for b in range(256)] + words[:63]
    return "".join(f"{i} {t!r} {len(t)}\n" for i, t in enumerate(tokens, start=1))


@pytest.fixture(scope="module")
def shared(tmp_path_factory, blinkdl_pth, pth_fp32_bundle):
    """The files and bundles every case may read (and none may change), made once."""
    from ssmport.exporter.pipeline import export
    from ssmport.runtime import Runner

    root = tmp_path_factory.mktemp("bad-inputs-shared")
    rwkv = root / "rwkv"
    rwkv.mkdir()
    rwkv_pth = write_pth(rwkv / "r.pth", blinkdl_state_dict(Dims(), seed=5))
    vocab = rwkv / "rwkv_vocab_v20230424.txt"
    vocab.write_text(small_world_vocab())
    config, tensors = fla_from_blinkdl(torch.load(blinkdl_pth, weights_only=True), Dims())
    fla = write_hf_folder(root / "fla", config, tensors, shards=2)
    tok = export(str(rwkv_pth), root / "bundles", quant="fp32", gate_steps=4, progress=False, prefill_chunk=8).path
    spec = export(str(rwkv_pth), root / "bundles", quant="fp32", gate=False, progress=False, prefill_chunk=8, verify=4,
                  name="spec").path  # fmt: skip
    snapshot = root / "tok.state"
    with Runner(tok) as runner:
        runner.feed([1, 2, 3])
        runner.snapshot().save(snapshot)
    return {
        "tok": tok, "plain": pth_fp32_bundle.path, "pth": blinkdl_pth, "rwkv_pth": rwkv_pth, "vocab": vocab, "fla": fla,
        "other_pth": write_pth(root / "other.pth", blinkdl_state_dict(Dims(), seed=6)),
        "small_pth": write_pth(root / "small.pth", blinkdl_state_dict(Dims(width=64, head=32, ffn=128), seed=7)),
        "m2": write_transformers_folder(root / "m2", Geometry(), seed=1, tied=False),
        "gdn": write_gdn_folder(root / "gdn", GDNDims(), seed=1), "snapshot": snapshot,
        "moe": write_lfm2_moe(root / "moe", seed=1), "spec": spec, "nemotron_moe": write_nemotron_moe(root / "nemotron-moe", seed=1),
        "lfm3": write_lfm3(root / "lfm3"), "rgemma": recurrent_gemma_files.write(root / "rgemma"),
        "rwkv6_pth": write_rwkv6_pth(root / "x060.pth", rwkv6_state_dict(RWKV6Dims(), seed=1)), "_roots": [root, pth_fp32_bundle.path, blinkdl_pth],
    }  # fmt: skip


def tree_state(roots: list[Path]) -> dict[str, tuple]:
    """Every entry under `roots`: (kind, content hash or link target); never opens a FIFO,
    socket or device, never follows a link."""
    state: dict[str, tuple] = {}

    def entry(path: Path) -> tuple:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            return ("link", os.readlink(path))
        if stat.S_ISREG(st.st_mode):
            return ("file", hashlib.sha256(path.read_bytes()).hexdigest(), stat.S_IMODE(st.st_mode))
        return ("dir",) if stat.S_ISDIR(st.st_mode) else ("special", stat.S_IFMT(st.st_mode))

    for root in roots:
        if not os.path.lexists(root):
            continue
        state[str(root)] = entry(root)
        if root.is_dir() and not root.is_symlink():
            for folder, dirs, files in os.walk(root):
                for name in dirs + files:
                    p = Path(folder) / name
                    state[str(p)] = entry(p)
    return state


def _timeout(signum, frame):
    raise TimeoutError(f"the case ran past {CASE_SECONDS} s: unbounded work on bad input")


def run_in_process(argv, stdin: bytes | None, capsys, monkeypatch) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    previous = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(CASE_SECONDS)
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse exits by itself
        code = exc.code
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    out, err = capsys.readouterr()
    return code, out, err


def run_in_child(case, argv, env: dict) -> tuple[int, str, str]:
    stdout, preexec = subprocess.PIPE, None
    if case.id.startswith("stdout-closed"):
        stdout, preexec = None, lambda: os.close(1)
    elif case.id.startswith("stdout-full"):
        stdout = open("/dev/full", "w")  # noqa: SIM115 (closed below)
    try:
        proc = subprocess.run([sys.executable, "-m", "ssmport.cli.main", *map(os.fsencode, map(str, argv))],
                              input=case.stdin, stdout=stdout, stderr=subprocess.PIPE, env=os.environ | env,
                              preexec_fn=preexec, timeout=CASE_SECONDS)  # fmt: skip
    finally:
        if hasattr(stdout, "close"):
            stdout.close()
    return proc.returncode, (proc.stdout or b"").decode(errors="replace"), proc.stderr.decode(errors="replace")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case, shared, tmp_path, capsys, monkeypatch):
    env = Env(tmp=tmp_path / "case", **{k: v for k, v in shared.items() if not k.startswith("_")})
    env.tmp.mkdir()
    try:
        argv = case.argv(env)
        extra_env = case.env(env) if case.env else {}
        roots = [env.tmp, *shared["_roots"]]
        before = tree_state(roots)
        if case.process:
            code, out, err = run_in_child(case, argv, extra_env)
        else:
            for key, value in extra_env.items():
                monkeypatch.setenv(key, value)
            code, out, err = run_in_process(argv, case.stdin, capsys, monkeypatch)
        after = tree_state(roots)
    finally:
        for undo in reversed(env.setup_done):
            undo()
    assert INTERNAL_ERROR not in err, err
    assert "Traceback" not in err + out, err
    assert err.count("\n") == 1 and err.startswith("ssmport: error:"), f"not one error line: {err!r}"
    assert case.message in err, err
    assert code == case.code, (code, err)
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    assert not changed, f"files changed, appeared or vanished: {changed[:10]}"


def test_every_subcommand_is_covered():
    from ssmport.cli.main import COMMANDS

    covered = {c.command for c in CASES}
    assert set(COMMANDS) <= covered and "--plugin" in covered, set(COMMANDS) - covered
    assert len(CASES) >= 200


def test_docs_table_is_current():
    """docs/errors.md carries the table generated from the cases (`python tests/bad_inputs.py`)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "errors.md").read_text()
    assert markdown() in text, "docs/errors.md is out of date: run `python tests/bad_inputs.py`"

