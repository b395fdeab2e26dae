"""Where transformers' own decode step spends its time (the peer of benchmarks/hybrid_speed.py,
its pure-torch path, one thread): the wall time of each decoder layer and of the LM head,
from forward hooks, the median over the timed steps; the rest of the step (embedding, final
norm, soft cap, the cache's bookkeeping) is what they leave.

    python benchmarks/peer_profile.py recurrentgemma-2b:3 --steps 16 --warmup 2

The counterpart of benchmarks/profile_ops.py (the Core AI runtime's per-op profile) for the
share of the LM head and of each layer kind on the peer's side.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import hybrid_speed  # noqa: E402
import suite  # noqa: E402


def timed(module: torch.nn.Module, into: list[float]) -> None:
    """Append each forward's wall ms of `module` to `into`."""
    start: list[float] = []
    module.register_forward_pre_hook(lambda m, a: start.append(time.perf_counter()))
    module.register_forward_hook(lambda m, a, o: into.append(1000 * (time.perf_counter() - start.pop())))


MIXERS = ("temporal_block", "mixer", "self_attn", "linear_attn", "conv")  # transformers' names of a layer's mixer


def layer_kind(layer: torch.nn.Module) -> str:
    """The class of the layer's mixer (the layer class is often one for every kind), else the layer's."""
    inner = next((getattr(layer, n) for n in MIXERS if isinstance(getattr(layer, n, None), torch.nn.Module)), layer)
    return type(inner).__name__


def profile(spec: str, steps: int, warmup: int) -> dict:
    torch.set_num_threads(1)
    peer = hybrid_speed.open_peer(hybrid_speed.synthetic_model(spec))
    try:
        hf = peer.model
        times: dict[str, list[float]] = collections.defaultdict(list)
        names = [f"layer {i} ({layer_kind(layer)})" for i, layer in enumerate(hf.model.layers)]
        for name, layer in zip(names, hf.model.layers):
            timed(layer, times[name])
        timed(hf.get_output_embeddings(), times["lm_head"])
        step_ms = []
        for j, token in enumerate(suite.bench_tokens(hf.config.vocab_size, steps + warmup)):
            if j == warmup:
                for t in times.values():
                    t.clear()
            start = time.perf_counter()
            peer.step(int(token))
            if j >= warmup:
                step_ms.append(1000 * (time.perf_counter() - start))
    finally:
        peer.close()
    whole = float(np.median(step_ms))
    parts = {name: float(np.median(t)) for name, t in times.items()}
    parts["rest"] = whole - sum(parts.values())
    return {"model": spec, "peer": peer.name, "steps": steps, "warmup": warmup, "ms_per_step": whole,
            "parts": {name: {"ms": ms, "share": ms / whole} for name, ms in parts.items()}}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="PRESET or PRESET:N (hybrid_speed.py's synthetic models)")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", type=Path, help="results JSON")
    a = p.parse_args()
    try:
        result = profile(a.model, a.steps, a.warmup)
    except suite.PeerRefusal as e:
        raise SystemExit(f"{a.model}: {e}") from None
    print(f"{result['peer']}, {a.model}: {result['ms_per_step']:.1f} ms/step (median of {a.steps})")
    for name, r in result["parts"].items():
        print(f"  {name:44} {r['ms']:8.2f} ms {100 * r['share']:5.1f}%")
    if a.out:
        a.out.write_text(json.dumps(result | {"command": " ".join(sys.argv)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
