"""RecurrentGemma's tiny fixture (tests/recurrent_gemma_files.py: window 8, a 40-token stream)
exported fp32 at --context 64 and 4096: the states of both manifests, the M=1 loop on the Core
AI runtime against transformers' full-sequence forward, and chunked prefill (32 tokens per call)
against the M=1 loop. Run: PYTHONPATH=$PWD python benchmarks/recurrent_gemma_parity.py OUT_DIR"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import recurrent_gemma_files as rf  # noqa: E402
from ssmport.exporter.pipeline import export  # noqa: E402
from ssmport.runtime import Runner  # noqa: E402


def main(out: Path) -> None:
    folder = rf.write(out / "tiny", seed=3)
    theirs = rf.full_logits(folder, rf.TOKENS).numpy()
    for context in (64, 4096):
        bundle = export(str(folder), out / f"context{context}", quant="fp32", gate_steps=6, prefill_chunk=32,
                        context=context, progress=False, overwrite=True)  # fmt: skip
        states = [(s.name, s.shape, s.kind) for s in bundle.manifest.states]
        print(f"--context {context}: {states}, {bundle.manifest.fixed_state_bytes} state bytes")
    with Runner(bundle.path, prefill=False) as runner:
        ours = runner.step_each(rf.TOKENS)
    print(f"M=1 loop vs transformers, {len(rf.TOKENS)} tokens: max |Δlogits| {np.abs(ours - theirs).max():.3g} "
          f"(scale {np.abs(theirs).max():.3g}), top-1 equal: {(ours.argmax(-1) == theirs.argmax(-1)).all()}")  # fmt: skip
    with Runner(bundle.path) as fast, Runner(bundle.path, prefill=False) as slow:
        got, want = fast.feed(rf.TOKENS), slow.feed(rf.TOKENS)
        states = {n: f"{np.abs(fast.state(n) - slow.state(n)).max():.3g}" for n in fast.state_names}
        print(f"prefill vs M=1 loop: max |Δlogits| {np.abs(got - want).max():.3g}, states {states}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
