"""Exported bundles on the Core AI runtime vs BlinkDL's `rwkv` package (RWKV_x070), per recipe.

Writes tiny checkpoints in three on-disk forms (BlinkDL .pth fp32, .pth bf16 without layer
0's v-LoRA, a 3-shard fla safetensors folder), exports each under fp32 / fp16 / int8keepproj,
feeds the same 16 tokens and prints max |Δlogits| and top-1 agreement against the `rwkv`
package's fp32 logits (`pip install ".[test]"` provides it).

    python benchmarks/parity_vs_rwkv.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from rwkv7_files import Dims, blinkdl_state_dict, fla_from_blinkdl, rwkv_package_logits, write_hf_folder, write_pth  # noqa: E402

from ssmport.exporter.pipeline import export  # noqa: E402
from ssmport.runtime import Runner  # noqa: E402

TOKENS = [1, 45, 45, 300, 7, 0, 19, 222, 5, 5, 5, 128, 64, 2, 319, 11]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp, d = Path(tmp), Dims()
        pth32 = write_pth(tmp / "a.pth", blinkdl_state_dict(d, 11))
        pth16 = write_pth(tmp / "b.pth", blinkdl_state_dict(d, 12, layer0_v=False, dtype=torch.bfloat16))
        fla = write_hf_folder(tmp / "fla", *fla_from_blinkdl(torch.load(pth32, weights_only=True), d), shards=3)
        print(f"{'checkpoint':14} {'recipe':13} {'max|Δ|':>9} {'rel':>9} top-1")
        for label, source, reference in (("pth fp32", pth32, pth32), ("pth bf16", pth16, pth16), ("fla 3 shards", fla, pth32)):
            ref = rwkv_package_logits(reference, TOKENS).numpy()
            for recipe in ("fp32", "fp16", "int8keepproj"):
                name = f"{label.replace(' ', '_')}-{recipe}"
                result = export(str(source), tmp / "out", quant=recipe, gate=False, progress=False, name=name)
                with Runner(result.path) as runner:
                    got = runner.step_each(TOKENS)
                delta = np.abs(ref - got).max()
                agree = int((ref.argmax(-1) == got.argmax(-1)).sum())
                print(f"{label:14} {recipe:13} {delta:9.2e} {delta / np.abs(ref).max():9.2e} {agree}/{len(TOKENS)}")


if __name__ == "__main__":
    main()
