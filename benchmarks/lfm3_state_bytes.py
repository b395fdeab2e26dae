"""State bytes against --context for the lfm3-1.7b preset: the sliding layers as rings (what
ssmport exports) next to the linear-cache alternative (their K/V sized by the context too).
Computed from the architecture's own state specs; nothing is exported.

    PYTHONPATH=. python benchmarks/lfm3_state_bytes.py [--dtype fp16|fp32]
"""

from __future__ import annotations

import argparse

from ssmport.architectures import get_architecture, presets
from ssmport.state import STATE_DTYPES

CONTEXTS = (2048, 4096, 8192, 32768, 128000)
MIB = 1 << 20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="fp16", choices=("fp16", "fp32"))
    a = p.parse_args()
    arch = get_architecture("lfm3")
    base = arch.config_from_json(dict(presets()["lfm3-1.7b"].config))
    print("| context | full-attention KV MiB | rings MiB | conv MiB | total MiB | sliding as a linear cache MiB | total with it MiB |")
    print("|---|---|---|---|---|---|---|")
    for context in CONTEXTS:
        specs = arch.state_specs(arch.with_context(base, context), STATE_DTYPES[a.dtype])
        by_kind = {k: sum(s.nbytes for s in specs if s.kind == k) for k in ("kv", "ring", "fixed")}
        linear = sum(s.nbytes // s.window * context for s in specs if s.kind == "ring")
        total = sum(by_kind.values())
        print(f"| {context} | {by_kind['kv'] / MIB:.1f} | {by_kind['ring'] / MIB:.2f} | {by_kind['fixed'] / MIB:.2f} | "
              f"{total / MIB:.1f} | {linear / MIB:.1f} | {(total - by_kind['ring'] + linear) / MIB:.1f} |")


if __name__ == "__main__":
    main()
