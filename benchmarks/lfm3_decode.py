"""LFM3 decode speed, ssmport's Core AI bundle against transformers' `Lfm3ForCausalLM` in the same
run, on the same weights, at LFM3-1.7B's widths (the `lfm3-1.7b` preset) with its first N layers
(default 5: conv, conv, full attention, conv, sliding; the fp32 model at full depth does not
fit this shared machine's time budget). Random trained-like weights (tests/lfm3_files.py's fill),
written once as a transformers folder; ssmport exports that folder (fp32, no gate).

    flock /tmp/ssmport-heavy.lock python benchmarks/lfm3_decode.py --layers 5 --context 512

Prints one JSON line: median ms/token over --steps decode tokens after --warmup, for the Core AI
runtime (single-threaded) and transformers with its cache at 1 thread, how far apart their logits
were over the warm-up tokens (max |Δ| / logit scale), and the states' bytes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=5, help="the preset's first N layers (default 5: one of each kind)")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--work", type=Path, default=Path("/tmp/ssmport-lfm3-bench"))
    a = p.parse_args()

    import hybrid_files as hf
    from transformers import Lfm3Config, Lfm3ForCausalLM

    import ssmport
    from ssmport.exporter.pipeline import export
    from ssmport.runtime import Runner

    preset = dict(ssmport.presets()["lfm3-1.7b"].config)
    kinds = preset["layer_types"][: a.layers]
    folder = a.work / f"lfm3-1.7b-widths-{a.layers}l"
    if not (folder / "config.json").exists():
        config = Lfm3Config(vocab_size=preset["vocab_size"], hidden_size=preset["hidden_size"],
                            intermediate_size=preset["intermediate_size"], num_hidden_layers=a.layers, layer_types=kinds,
                            num_attention_heads=preset["num_heads"], num_key_value_heads=preset["num_kv_heads"],
                            head_dim=preset["head_dim"])  # fmt: skip
        torch.manual_seed(0)
        model = Lfm3ForCausalLM(config).eval()
        hf._fill_trained_like(model, 0)
        folder.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(folder))
        del model
    bundle = export(str(folder), a.work / "bundles", quant="fp32", gate=False, context=a.context, progress=False,
                    overwrite=True)  # fmt: skip
    tokens = [int(t) for t in torch.randint(0, preset["vocab_size"], (a.warmup + a.steps,), generator=torch.Generator().manual_seed(1))]

    def timed(step) -> tuple[float, np.ndarray]:
        """(median ms/token after the warm-up, the warm-up tokens' logits [warmup, V])."""
        times, first = [], []
        for i, t in enumerate(tokens):
            start = time.perf_counter()
            logits = step(t)
            if i >= a.warmup:
                times.append((time.perf_counter() - start) * 1e3)
            else:
                first.append(np.asarray(logits, dtype=np.float32).reshape(-1))
        return statistics.median(times), np.stack(first)

    with Runner(bundle.path, prefill=False) as runner:
        coreai, ours = timed(runner.step)
        states = {s.name: (s.kind, list(s.shape)) for s in bundle.manifest.states}
    torch.set_num_threads(1)
    theirs = Lfm3ForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    cache = None

    @torch.no_grad()
    def hf_step(t: int) -> torch.Tensor:
        nonlocal cache
        out = theirs(torch.tensor([[t]]), cache=cache, use_cache=True)
        cache = out.cache
        return out.logits[0, -1].float().numpy()

    transformers_ms, reference = timed(hf_step)
    agreement = float(np.abs(ours - reference).max() / np.abs(reference).max())
    print(json.dumps({"layers": kinds, "context": a.context, "steps": a.steps, "coreai_ms_per_token": round(coreai, 2),
                      "transformers_1thread_ms_per_token": round(transformers_ms, 2),
                      "warmup_logits_max_rel_delta": agreement,
                      "fixed_and_ring_state_bytes": bundle.manifest.fixed_state_bytes,
                      "kv_bytes_per_token": bundle.manifest.kv_bytes_per_token, "states": states}))  # fmt: skip


if __name__ == "__main__":
    main()
