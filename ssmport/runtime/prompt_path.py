"""Which calls a prompt takes on the Linux Core AI runtime: the bundle's prefill chunks, or
`main` one token at a time.

A chunk saves the per-call and per-op work of feeding its tokens one by one, and every
bundle with a prefill function uses it, except one whose routed experts are branched
(`export --experts branched`) and large. Its chunk runs each expert some token of the chunk
chose over *all* the chunk's rows (ssmport.models.moe, `_branched`), and this runtime's
many-row matmul costs ~0.8x a one-row matmul per row (benchmarks/README.md, "the runtime's
many-row matmul"); so the chunk does about (experts chosen in the chunk) / k times the
experts' work of the one-token loop, which reads only each token's k. Where the experts are
large that work is the step's cost. One branched MoE layer, 4 of 32 experts, fp32, ms per token
one token a call vs in a chunk of 64 (`benchmarks/moe_forms.py --rows 1 64 --forms branch`;
benchmarks/results/moe_forms_branched_rows_2026-12-07.txt):

    largest expert matrix (gate|up)   128x192  256x384  512x768  1024x1536  2048x3584 (LFM2-8B-A1B)
    one token a call                  0.35     0.40     0.54     1.64       6.33
    in a chunk                        0.088    0.28     0.82     3.24       22.5 (a chunk of 32)

So a branched bundle whose largest expert matrix holds BRANCHED_CHUNK_LIMIT parameters or
more (between the last size where chunks won and the first where they lost) feeds its prompts
through `main`; whole bundles agree (benchmarks/prompt_path.py: lfm2-moe-tiny 5.3x faster in
chunks, LFM2-8B-A1B's first 4 layers 1.5x faster one token a call). The released MoE presets
are all far above the limit (the smallest, Granite-4.0-H-Tiny's gate|up, is 1536x1024), the
tiny test presets far below. The rule is this runtime's, whose many-row matmul gains little
over one row: the bundle keeps its prefill function (on a GPU, rows are expected to come
nearly free next to reading the weights; not measured, no device here), and
`Runner(prefill=True)` still uses it.
"""

from __future__ import annotations

import math

from ssmport.manifest import Manifest
from ssmport.models.moe import BRANCHED

BRANCHED_CHUNK_LIMIT = 2**18  # parameters of one expert matrix: 1 MiB in fp32


def largest_expert_matrix(manifest: Manifest) -> int:
    """Parameters of the largest single-expert matrix in the bundle's plan (0: no routed experts)."""
    return max((math.prod(e["shape"][1:]) for e in manifest.plan_tensors if e.get("rows_read")), default=0)


def prompts_through_prefill(manifest: Manifest) -> bool:
    """Whether a Runner that was not told feeds prompts through the bundle's prefill function
    (when it has one) on this runtime; False: through a one-token `main`, one token a call (a
    `main` taking a chunk of rows would be no better: prefill is kept)."""
    branched = manifest.export.get("experts") == BRANCHED
    one_token_main = manifest.main.inputs[0].shape[1] == 1
    return not (branched and one_token_main and largest_expert_matrix(manifest) >= BRANCHED_CHUNK_LIMIT)
