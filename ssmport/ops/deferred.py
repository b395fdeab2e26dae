"""The deferred whole-state update every recurrent decode step ends with.

A layer's decode step computes its output from the *old* state slice and returns the vectors
of its update instead of the new slice; the graph then applies every layer's update to the
whole stacked state in a few elementwise passes and writes it once:

    S'[l] = S[l] * decay[l]  (+/-)  col_1[l] * row_1[l]  (+/-)  col_2[l] * row_2[l] ...

(RWKV-7: diag(w) S - (kk*a)(kk^T S) + k v^T; Mamba-2: S exp(dt A) + (dt x) B^T; Gated DeltaNet:
S g + k u^T; Mamba-1: S exp(dt A) + (dt x) B^T with A [I, N], an `Exp` decay.) Writing each
layer's new slice instead copies the whole state once per layer on the Linux Core AI runtime (a
scatter): ~45 ms per token for RWKV-7 1.5B, 27 of 105 ms for mamba2-130m.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ssmport.ops.rows import repeat_groups, stack_rows


class Outer(NamedTuple):
    """col * row: each layer's two vectors of one outer-product term."""

    col: torch.Tensor
    row: torch.Tensor
    minus: bool = False  # subtract instead of add


class Exp(NamedTuple):
    """A decay given as exp(rate * scale): `rate` computed per call, `scale` a constant of the
    layer (Mamba-1: dt [I] and A [I, N]). `apply` stacks only the small rates and multiplies
    the stack by every layer's scale at once, so a decay the size of the state is never stacked
    per call (a 2.4 MB concat cost mamba-130m 22 ms of a 70 ms decode step on the Linux runtime:
    benchmarks/README.md). `scale` must be a weight: the stack of every layer's is then a stack
    of constants, which the converter folds into one constant (stored beside the layers' own:
    +2.25 MiB at mamba-130m, no op per call; tests/test_mamba1.py checks the fold)."""

    rate: torch.Tensor
    scale: torch.Tensor


class PerGroup(NamedTuple):
    """A term's vector shared by groups of consecutive heads: `tensor` [G, ...] serves heads
    g*(H/G) .. (g+1)*(H/G)-1 (Mamba-2's B). `apply` stacks the small [G, ...] rows and
    repeats the stack per head once, so the state is updated in its own [H, ...] layout: a
    [G, H/G, ...] view of the stacked state is a copy of the whole state, twice a call, on the
    Linux runtime (two 1.3 ms reshapes of 27.5 MB at Nemotron-H-4B's widths, 14 layers)."""

    tensor: torch.Tensor
    heads_per_group: int


class StateUpdate(NamedTuple):
    """One layer's S' = S * decay + sum of its outer terms.

    The tensors keep the shapes the layer computed them in; `shapes` says how each broadcasts
    against `view`, the layer's state slice as the update sees it (RWKV-7 [H, N, Nv], Mamba-2
    [H, P, N]): the decay's first, then each term's col and row (a `PerGroup` one's shape is
    per head, after its repeat). Each field's stack of all layers is reshaped once, so no
    per-layer reshape enters the graph. Every layer of a state uses the same shapes.
    """

    decay: torch.Tensor | Exp
    terms: tuple[Outer, ...]
    view: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]

    def fields(self) -> list:
        """decay (its rate), col_1, row_1, ... as given: a `PerGroup` one still wrapped."""
        decay = self.decay.rate if isinstance(self.decay, Exp) else self.decay
        return [decay, *(t for term in self.terms for t in (term.col, term.row))]

    def pieces(self) -> list[torch.Tensor]:
        """decay (an `Exp` decay's rate), col_1, row_1, col_2, row_2, ... (in the order of `shapes`)."""
        return [t.tensor if isinstance(t, PerGroup) else t for t in self.fields()]

    def groups(self) -> list[int]:
        """Each piece's heads per group (1: one row per head), in the order of `pieces`."""
        return [t.heads_per_group if isinstance(t, PerGroup) else 1 for t in self.fields()]


def _per_head(stacked: torch.Tensor, heads_per_group: int, shape: tuple[int, ...]) -> torch.Tensor:
    """[L, G*rest] rows of per-group vectors as [L, *shape], each group's repeated for its heads
    (the heads: shape's first axis other than 1)."""
    L = stacked.shape[0]
    if heads_per_group == 1:
        return stacked.view(L, *shape)
    axis = next(i for i, d in enumerate(shape) if d != 1)
    groups = shape[axis] // heads_per_group
    if groups == 1:  # one vector for every head: broadcasting repeats it, with no op
        return stacked.view(L, *shape[:axis], 1, *shape[axis + 1 :])
    return repeat_groups(stacked.view(L, groups, -1), 1, heads_per_group).view(L, *shape)


def _combine(S: torch.Tensor, fields: list[torch.Tensor], terms: tuple[Outer, ...]) -> torch.Tensor:
    S = S * fields[0]
    for j, term in enumerate(terms):
        product = fields[1 + 2 * j] * fields[2 + 2 * j]
        S = S - product if term.minus else S + product
    return S


def apply(buffer: torch.Tensor, updates: list[StateUpdate]) -> None:
    """buffer <- every layer's update, computed in fp32 over the whole stacked state and
    written with one in-place copy (one `write_handle`)."""
    L, first = len(updates), updates[0]
    # The state in its own shape when that is [L, 1, .., 1, *view], so neither it nor the new
    # state is reshaped: a reshape of the whole state is a copy on the Linux runtime.
    lead = buffer.shape[1 : buffer.dim() - len(first.view)]
    if tuple(buffer.shape[buffer.dim() - len(first.view) :]) != first.view or any(d != 1 for d in lead):
        lead = ()
    columns = zip(*(u.pieces() for u in updates))  # field by field, every layer's tensor
    fields = [_per_head(stack_rows(list(pieces)), hg, (*lead, *shape))
              for pieces, hg, shape in zip(columns, first.groups(), first.shapes)]  # fmt: skip
    if isinstance(first.decay, Exp):
        scale = first.decay.scale
        ones = (1,) * (len(lead) + len(first.view) - scale.dim())
        fields[0] = torch.exp(fields[0] * torch.stack([u.decay.scale for u in updates]).float().view(L, *ones, *scale.shape))
    S = _combine(buffer.float().view(L, *lead, *first.view), fields, first.terms)
    buffer.copy_(S.view(buffer.shape).to(buffer.dtype))


def apply_naive(state: torch.Tensor, update: StateUpdate) -> torch.Tensor:
    """One layer's new slice [*view], from its old slice (any shape with view's elements)."""
    fields = [_per_head(t.reshape(1, -1), hg, shape)[0] for t, hg, shape in zip(update.pieces(), update.groups(), update.shapes)]
    if isinstance(update.decay, Exp):
        fields[0] = torch.exp(fields[0] * update.decay.scale.float())
    return _combine(state.float().reshape(update.view), fields, update.terms)
