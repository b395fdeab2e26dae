"""Chunked prefill: the shared pieces every architecture's `prefill` function is built from.

A bundle may carry a second function, `prefill`, beside the M=1 decode function `main`, in
the same asset (the converter stores the weights the two share once). It ingests a fixed
chunk of T prompt tokens per call:

    prefill(input_ids int32 [1,T], position_ids int32 [1,T], valid_len int32 [1]) -> logits [1,1,V]

and reads and writes the same named states as `main`, each exactly once per call.

A short final chunk is padded, not given its own graph: tokens at t >= valid_len are
padding and never touch a state (a loop runs valid_len steps; a chunkwise form zeroes their
contributions), and the logits are those of token valid_len-1. Everything that is not the
recurrence (projections, norms, MLPs) is batched over all T rows; the padded rows are computed
and thrown away. 1 <= valid_len <= T. The generic graph (ssmport.graph) builds this function
from an architecture's blocks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads on first use: the CLI imports this module for DEFAULT_CHUNK
    import torch

PREFILL_FUNCTION = "prefill"
PREFILL_INPUT_NAMES = ("input_ids", "position_ids", "valid_len")
DEFAULT_CHUNK = 64
# The largest chunk an export builds: the chunkwise forms hold [H, T, T] matrices, so a chunk
# of 10^8 would be allocated for minutes before failing; 4096 is 64x the default.
MAX_CHUNK = 4096


def check_chunk(chunk: int | None) -> None:
    """Refuse a prefill chunk outside [1, MAX_CHUNK] (None: no prefill function)."""
    from ssmport.errors import SsmportError

    if chunk is not None and not 1 <= chunk <= MAX_CHUNK:
        raise SsmportError(f"--prefill-chunk must be between 1 and {MAX_CHUNK} tokens (got {chunk:,}), or pass --no-prefill")


def example_inputs(chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tracing inputs of the prefill signature (values are irrelevant to the graph)."""
    import torch

    return (
        torch.zeros(1, chunk, dtype=torch.int32),
        torch.zeros(1, chunk, dtype=torch.int32),
        torch.full((1,), chunk, dtype=torch.int32),
    )


__all__ = ["DEFAULT_CHUNK", "MAX_CHUNK", "check_chunk", "PREFILL_FUNCTION", "PREFILL_INPUT_NAMES", "example_inputs"]
