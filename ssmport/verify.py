"""The `verify` function: K draft tokens in, the logits of every one of them out.

Speculative decoding (ssmport.runtime.speculative) checks K drafted tokens with one call of
the target instead of K. A bundle exported with `--verify K` carries, beside `main` and
`prefill` (same weights, same states), the function

    verify(input_ids int32 [1,K], position_ids int32 [1,K], valid_len int32 [1]) -> logits [1,K,V]

which is the prefill graph over K rows with the head on every row: row t's logits are those
after token t; rows >= valid_len are padding and never reach a state; each state is written
once per call, a kv state's rows at their positions.

Rollback. After a call every state holds all valid_len tokens. When the target rejects a
draft, the runner rewinds to a copy of the *fixed* states taken before the call (O(state),
never O(context)) and the accepted tokens ride along at the head of the next verify call, so
a rejection costs no extra call. A kv state is not copied: the rejected rows sit at positions
past the accepted ones, which the next call writes before any attention reads them.
Why this form and not per-position states as outputs: docs/speculative.md (measured).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

VERIFY_FUNCTION = "verify"
# A checkpoint's own draft head (Qwen3.5's MTP: ssmport.models.qwen3_5.mtp), exported beside
# verify as one more function with its own states; the target's functions then also output
# every row's final-norm hidden state, which the head drafts from.
DRAFT_FUNCTION = "draft"
DRAFT_INPUT_NAMES = ("input_ids", "position_ids", "hidden", "valid_len")
DRAFT_OUTPUT_NAMES = ("logits", "hidden")
HIDDEN_OUTPUT = "hidden"
# The most drafts one call may check: acceptance falls off long before (each draft must hold
# for the next to count), and the call's cost grows with its rows.
MAX_VERIFY = 64


def check_verify(k: int | None) -> None:
    """Refuse a verify width outside [2, MAX_VERIFY] (None: no verify function)."""
    from ssmport.errors import SsmportError

    if k is not None and not 2 <= k <= MAX_VERIFY:
        raise SsmportError(f"--verify must be between 2 and {MAX_VERIFY} tokens (got {k:,}), or left out")


def build_verify(decode: nn.Module, k: int) -> nn.Module | None:
    """The verify module over the decode module's own blocks (shared weights), or None for an
    architecture whose decode module is not the generic graph."""
    from ssmport.graph import CausalLM

    if not isinstance(decode, CausalLM):
        return None
    return CausalLM(decode.embed, decode.layers, decode.head, decode.specs, chunk=k, all_logits=True)


__all__ = ["DRAFT_FUNCTION", "DRAFT_INPUT_NAMES", "DRAFT_OUTPUT_NAMES", "HIDDEN_OUTPUT", "MAX_VERIFY", "VERIFY_FUNCTION", "build_verify", "check_verify"]
