"""examples/xlstm.py: an architecture ssmport does not ship, end to end, against independent
references. It registers itself when imported, so everything runs in fresh interpreters.

The references: Hugging Face transformers' own xLSTMForCausalLM on the checkpoint the example
writes (its chunkwise, full-sequence form), and below, the mLSTM recurrence straight from the
xLSTM paper's equations (no stabiliser, float64) against the example's stabilised cell.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "xlstm.py"

DRIVER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import numpy as np
    import torch
    from ssmport.plugins import load_plugin
    from ssmport.testing import check_architecture, step_logits
    from ssmport.cli.main import main

    example, work = load_plugin(sys.argv[1]), Path(sys.argv[2])
    checkpoint = example.write_checkpoint(work / "ckpt")
    report = check_architecture(example.XLSTM, None, work / "contract", checkpoint=checkpoint)
    print(report, file=sys.stderr)

    # the CLI path a user takes, then transformers on the same checkpoint
    assert main(["--plugin", sys.argv[1], "export", str(checkpoint), "-o", str(work / "out"), "--quant", "fp32"]) == 0
    import ssmport
    from transformers import xLSTMConfig, xLSTMForCausalLM

    tokens = [1, 45, 45, 200, 7, 0, 19, 222, 5, 5, 5, 128, 64, 2, 255, 11]
    config = xLSTMConfig.from_pretrained(checkpoint)
    config.autocast_kernel_dtype = "float32"  # its kernels default to bf16 compute
    hf = xLSTMForCausalLM.from_pretrained(checkpoint, config=config, dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = hf(torch.tensor([tokens]), use_cache=False).logits[0].float().numpy()
    with ssmport.load(work / "out" / "ckpt-fp32") as runner:
        ours = step_logits(runner, tokens)
    print(json.dumps({
        "failures": [c.line() for c in report.failures],
        "checks": {c.name: c.passed for c in report.checks},
        "max_abs": float(np.abs(theirs - ours).max()),
        "scale": float(np.abs(theirs).max()),
        "top1_equal": bool((theirs.argmax(-1) == ours.argmax(-1)).all()),
    }))
    """
)


def _run(*argv):
    return subprocess.run([sys.executable, *map(str, argv)], capture_output=True, text=True)


def test_example_runs_end_to_end(tmp_path):
    proc = _run(EXAMPLE, "--out", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "gate:   PASS fp32" in proc.stdout
    ids = proc.stdout.split("generated ids:")[1].strip().split(",")
    assert len(ids) == 12 and all(0 <= int(i) < 256 for i in ids)
    assert (tmp_path / "xlstm-tiny-checkpoint" / "config.json").is_file()


def test_example_contract_and_transformers_parity(tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    proc = _run(driver, EXAMPLE, tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["failures"] == [], proc.stderr[-4000:]
    assert result["checks"]["strict loading"] and result["checks"]["coreai"]
    assert result["max_abs"] / result["scale"] < 1e-4, result
    assert result["top1_equal"]


def test_example_cell_matches_the_paper_equations():
    """The example's stabilised mLSTM cell against the unstabilised recurrence of the xLSTM
    paper (eqs. for C_t, n_t, h_t with exp input gate and sigmoid forget gate), in float64."""
    code = textwrap.dedent(
        """
        import math, sys, torch
        from ssmport.plugins import load_plugin
        cell = load_plugin(sys.argv[1]).mlstm_cell
        g = torch.Generator().manual_seed(3)
        dk, dv, T = 5, 7, 40
        C, n, m = torch.zeros(dk, dv), torch.zeros(dk), torch.zeros(())
        C64, n64 = torch.zeros(dk, dv, dtype=torch.float64), torch.zeros(dk, dtype=torch.float64)
        worst = 0.0
        for t in range(T):
            q, k = torch.randn(dk, generator=g), torch.randn(dk, generator=g)
            v = torch.randn(dv, generator=g)
            i_pre, f_pre = 4 * torch.randn((), generator=g), 2 + 2 * torch.randn((), generator=g)
            h, C, n, m = cell(C, n, m, q, k, v, i_pre, f_pre, 0.0)
            i_gate, f_gate = math.exp(float(i_pre)), 1 / (1 + math.exp(-float(f_pre)))
            C64 = f_gate * C64 + i_gate * torch.outer(k.double(), v.double())
            n64 = f_gate * n64 + i_gate * k.double()
            qs = q.double() / math.sqrt(dk)
            h64 = (qs @ C64) / max(abs(float(qs @ n64)), 1.0)
            worst = max(worst, float((h.double() - h64).abs().max() / h64.abs().max()))
        print(worst)
        """
    )
    proc = _run("-c", code, EXAMPLE)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert float(proc.stdout.strip()) < 1e-5
