"""Decode cost follows the tokens held, not the context allocated (issue 32, part 0).

A hybrid's KV caches have a dynamic position axis in both layouts (ssmport.growing_kv, the
apple layout); the runner allocates 256 positions and doubles (ssmport.runtime.kv_growth). So
a decode call at a given length does the very same work in a --context 512 and a --context
4096 bundle: the same ops (counted by the runtime's profiler), the same buffers, the same
logits bit for bit. Growth is exact (prefill and the M=1 loop across its boundaries, snapshots
restored across them), and the context still bounds memory and is refused past.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from prefill_checks import prompt

from ssmport import export
from ssmport.errors import SsmportError
from ssmport.runtime import Runner
from ssmport.runtime.kv_growth import positions_for
from ssmport.runtime.op_count import OpLog, summarize
from ssmport.loader.resolve import load_model

HELD = 100  # tokens of history when the decode call is counted (the figure)
CONTEXTS = (512, 4096)
LAYOUTS = ("ssmport", "apple")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    out = tmp_path_factory.mktemp("growing")
    # the 4096 bundles decode only (their prompts go through the M=1 loop): a faster export
    return {(layout, context): export("lfm2-tiny", out, quant="fp32", gate=False, progress=False, layout=layout,
                                      context=context, prefill_chunk=16 if context == 512 else None,
                                      name=f"{layout}-{context}").path
            for layout in LAYOUTS for context in CONTEXTS}  # fmt: skip


def decode_at(bundle, held: int):
    """(ops of one decode call, its logits, the KV positions allocated) after `held` tokens."""
    log = OpLog()
    with Runner(bundle, prefill=False, profiler=log.profiler()) as runner:
        runner.feed(prompt(held, runner.vocab_size))
        logits = runner.step(7)
        return summarize(log.calls[-1]), logits, runner.kv_positions


def assert_same_work_at_both_contexts(bundles, layout):
    (small_ops, small_logits, small_kv), (big_ops, big_logits, big_kv) = (
        decode_at(bundles[layout, context], HELD) for context in CONTEXTS)  # fmt: skip
    assert small_kv == big_kv == 256  # the positions a call reads and writes
    assert small_ops.ops == big_ops.ops and small_ops.by_type == big_ops.by_type
    np.testing.assert_array_equal(small_logits, big_logits)  # the same computation, not a similar one


@pytest.mark.parametrize("layout", LAYOUTS)
def test_decode_work_does_not_grow_with_the_allocation(bundles, layout):
    assert_same_work_at_both_contexts(bundles, layout)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_growth_is_exact_across_its_boundaries(bundles, layout):
    """Prompts crossing 16, 32 and 64 positions (start 16): prefill vs the M=1 loop vs a cache
    allocated whole, then decode steps on."""
    bundle = bundles[layout, 512]
    with Runner(bundle) as grown, Runner(bundle, prefill=False) as loop, Runner(bundle) as whole:
        tokens, then = prompt(70, grown.vocab_size), prompt(12, grown.vocab_size, seed=3)
        grown.kv_start = loop.kv_start = 16
        whole.kv_start = 512
        for r in (grown, loop, whole):
            r.reset()
        rows = [r.feed(tokens) for r in (grown, loop, whole)]
        assert np.abs(rows[0] - rows[1]).max() <= 1e-4 and np.abs(rows[0] - rows[2]).max() <= 1e-4
        assert (grown.kv_positions, loop.kv_positions, whole.kv_positions) == (128, 128, 512)
        for t in then:
            rows = [r.step(t) for r in (grown, loop, whole)]
            assert np.abs(rows[0] - rows[1]).max() <= 1e-4 and np.abs(rows[0] - rows[2]).max() <= 1e-4
        assert grown.kv_positions == 128


@pytest.mark.parametrize("layout", LAYOUTS)
def test_snapshot_restores_across_growth(bundles, layout):
    with Runner(bundles[layout, 512]) as runner:
        runner.kv_start = 16
        runner.reset()
        runner.feed(prompt(10, runner.vocab_size))
        snap = runner.snapshot()
        assert runner.kv_positions == 16
        after = [runner.step(t) for t in prompt(40, runner.vocab_size, seed=1)]
        assert runner.kv_positions == 64
        runner.restore(snap)
        assert runner.kv_positions == 16 and runner.tokens == list(snap.tokens)
        again = [runner.step(t) for t in prompt(40, runner.vocab_size, seed=1)]
        for a, b in zip(after, again):
            np.testing.assert_array_equal(a, b)


def test_the_context_bounds_the_allocation_and_is_refused_past(bundles):
    assert [positions_for(n, 4096) for n in (0, 1, 256, 257, 600, 4096, 5000)] == [256, 256, 256, 512, 1024, 4096, 4096]
    assert positions_for(300, 300) == 300 and positions_for(10, 100) == 100
    with Runner(bundles["ssmport", 512]) as runner:
        runner.kv_start = 16
        runner.reset()
        runner.feed(prompt(500, runner.vocab_size))
        assert runner.kv_positions == 512
        with pytest.raises(SsmportError, match="context is full"):
            runner.feed(prompt(13, runner.vocab_size))


OTHER_HYBRIDS = ("qwen3.5-tiny", "granite-hybrid-tiny", "nemotron-h-tiny")  # the same growing states


@pytest.fixture(scope="module", params=OTHER_HYBRIDS)
def decode_only_bundles(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    model = load_model(request.param, synthetic=True)  # the tiny presets were trained for 256 positions
    model = dataclasses.replace(model, config=dataclasses.replace(model.config, max_position_embeddings=max(CONTEXTS)))
    return {(layout, context): export(model, out, quant="fp32", gate=False, progress=False, layout=layout,
                                      context=context, prefill_chunk=None, name=f"{layout}-{context}").path
            for layout in LAYOUTS for context in CONTEXTS}  # fmt: skip


@pytest.mark.parametrize("layout", LAYOUTS)
def test_other_hybrids_decode_work_does_not_grow_with_the_allocation(decode_only_bundles, layout):
    assert_same_work_at_both_contexts(decode_only_bundles, layout)


def test_a_static_kv_cache_is_restored_whole(tmp_path, monkeypatch):
    """A KV cache with a static position axis (a plugin's own decode module, or a bundle
    exported before growing caches) is snapshotted up to its tokens and restored to its whole
    context, as a growing one is to its allocation."""
    import ssmport.layouts

    monkeypatch.setattr(ssmport.layouts.growing_kv, "grows", lambda specs: False)
    bundle = export("lfm2-tiny", tmp_path, quant="fp32", gate=False, progress=False, context=64,
                    prefill_chunk=None).path  # fmt: skip
    with Runner(bundle) as runner:
        assert runner.kv_positions is None  # nothing grows: every kv state is [.., 64, ..]
        runner.feed(prompt(10, runner.vocab_size))
        snap = runner.snapshot()
        after = [runner.step(t) for t in prompt(8, runner.vocab_size, seed=1)]
        runner.restore(snap)
        again = [runner.step(t) for t in prompt(8, runner.vocab_size, seed=1)]
    for a, b in zip(after, again):
        np.testing.assert_array_equal(a, b)
