"""Gating a bundle: whether the exported program computes what the model computes.

    reference.py     the fp32 logits the gate compares against, computed before the candidate
                     loads (whole, or layer by layer when the fp32 weights exceed 1 GiB)
    torch_runner.py  the Runner interface over the eager module (the reference's engine)
    report.py        the teacher-forced comparison (run_gate), its thresholds and GateReport
    run.py           gate_bundle: the gate of `ssmport export` and `ssmport gate` on a bundle
    checks.py        the bundle checks an export runs beside the gate: `verify` against `main`,
                     a shipped model's held-out score
    compare.py       every recipe side by side (`ssmport gate --compare`)

Nothing is imported here: `import ssmport.gate.report` does not load the runtime.
"""
