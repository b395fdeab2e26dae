"""Runtime ops per call: a figure that carries to the device.

The Core AI runtime's `Profiler` reports every op a call executes. On a GPU each of those is a
dispatch, with a fixed cost the Linux CPU timings do not show, so the count per decode call
and per prefill chunk is tracked beside the timings (`ssmport bench`, `ssmport inspect`, the
benchmark suite). Two kinds of event are counted apart from the kernels: `NDArray.*` (buffer
views, allocations and copies: memory bookkeeping) and shape work, which graphs with a dynamic
token count (the apple layout) run before their kernels: a `#op` event per op (its output
shape) plus `get_shape` / `broadcast_shapes`.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import numpy as np

from ssmport.bundle import Bundle

CALL_EVENT = "Function Execute"  # the profiler's event for a whole call
BOOKKEEPING_PREFIX = "NDArray."
SHAPE_PREFIX = "#"
SHAPE_OPS = frozenset({"get_shape", "broadcast_shapes"})


@dataclass(frozen=True)
class OpCount:
    """The ops of one call of one function."""

    ops: int  # kernels (a GPU dispatch each)
    shape: int  # output-shape work of dynamic-shape graphs
    bookkeeping: int  # NDArray.* views, allocations and copies
    by_type: dict[str, int] = field(default_factory=dict)  # kernels per op type, most first

    def to_json(self) -> dict:
        return {"ops": self.ops, "shape": self.shape, "bookkeeping": self.bookkeeping, "by_type": self.by_type}


def op_type(event_name: str) -> str:
    name = event_name.removeprefix("call.")
    shape = name.startswith(SHAPE_PREFIX)
    name = name.removeprefix(SHAPE_PREFIX).removeprefix("coreai.").removeprefix("decomposable.")
    return SHAPE_PREFIX + name if shape else name


def summarize(names: list[str]) -> OpCount:
    types = [op_type(n) for n in names]
    bookkeeping = sum(t.startswith(BOOKKEEPING_PREFIX) for t in types)
    shape = sum(t.startswith(SHAPE_PREFIX) or t in SHAPE_OPS for t in types)
    kernels = [t for t in types if not (t.startswith((BOOKKEEPING_PREFIX, SHAPE_PREFIX)) or t in SHAPE_OPS)]
    return OpCount(len(kernels), shape, bookkeeping, dict(collections.Counter(kernels).most_common()))


class OpLog:
    """Profiler callbacks that keep the names of the ops of each call, in call order; with
    `keep`, of the last `keep` calls only (a whole gate's calls need not be held)."""

    def __init__(self, keep: int | None = None) -> None:
        self.calls: list[list[str]] = []
        self.keep = keep

    def profiler(self):
        from coreai.runtime import Profiler

        return Profiler(on_log_event_begin=self._begin, on_log_event_end=lambda event, token: None)

    def _begin(self, event) -> int:
        if event.event_id == CALL_EVENT:
            self.calls.append([])
            if self.keep is not None:
                del self.calls[: -self.keep]
        elif self.calls:  # anything before the first call (loading) is not a call's op
            self.calls[-1].append(event.event_id)
        return 0


def count_ops(bundle: Bundle, prefill: bool = True, main: bool = True) -> dict[str, OpCount]:
    """Ops of one decode call (`main`, one token, unless not `main`) and, when the bundle has
    it (and `prefill`), of one full prefill chunk, of one full `verify` call and of one call of
    the draft head (`draft`, Qwen3.5's MTP), on zero states."""
    from ssmport.runtime.runner import Runner

    log = OpLog()
    counts: dict[str, OpCount] = {}
    with Runner(bundle, prefill=prefill, profiler=log.profiler()) as runner:
        if main:
            runner.step(1)
            counts["main"] = summarize(log.calls[-1])
        if prefill and runner.has_prefill:
            runner.reset()
            first = len(log.calls)
            # the tokens a prompt holds back for `main` (the apple layout's last one) come on top
            # of a full chunk (within the context of a KV cache)
            tokens = runner.prefill_chunk + runner.layout.held_back
            runner.feed([1] * min(tokens, runner.context or tokens))
            counts["prefill"] = summarize(log.calls[first])
        if runner.bundle.manifest.verify is not None:  # one full verify call (ssmport.verify)
            runner.reset()
            runner.verify([1] * min(runner.verify_rows, runner.context or runner.verify_rows))
            counts["verify"] = summarize(log.calls[-1])
        if runner.draft_rows is not None:  # one call of the draft head (a drafting step: one row)
            runner.draft([1], np.zeros((1, runner.hiddens.shape[1]), np.float32), 0)
            counts["draft"] = summarize(log.calls[-1])
    return counts
