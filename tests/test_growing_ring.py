"""A sliding-window ring grows like a KV cache (ssmport.growing_kv, issue 32 part 0): its slot
axis is dynamic in the default layout, the runner allocates START slots and doubles up to the
window W (ssmport.runtime.kv_growth), so a call reads and blends the slots the tokens need.

On tests/ringtoy.py with windows of 40 and 80 (not powers of two: the last growth stops at W,
not at a doubling) and a small START (8): the ring's allocation along the stream, the same
work and logits at both windows while the tokens fit the smaller ring, and decode, prefill
(chunks inside the ring, crossing its growth and its fill, longer than W), snapshots and a
rewind across every growth boundary and the wrap, against the plain reference loop and the
M=1 loop.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from prefill_checks import prompt
from ringtoy import RINGTOY, RingToyConfig

from ssmport.architectures import LoadedModel
from ssmport.exporter.pipeline import export
from ssmport.loader.resolve import load_model
from ssmport.runtime import Runner
from ssmport.runtime.op_count import OpLog, summarize

START = 8  # the runner's first allocation in these tests (256 in use)
WINDOWS = (40, 80)
CHUNK = 48  # longer than the smaller window
RINGS = ("slidingKeyCache", "slidingValueCache")


def toy(window: int) -> LoadedModel:
    cfg = dataclasses.replace(RingToyConfig(), window=window, context=256)
    return LoadedModel(RINGTOY, cfg, RINGTOY.synthetic_weights(cfg, 0), {"kind": "synthetic", "preset": "ringtoy-tiny",
                       "seed": 0}, name=f"ringtoy-w{window}")  # fmt: skip


def reference_logits(model: LoadedModel, tokens: list[int]) -> np.ndarray:
    ref = model.architecture.reference(model.config, model.weights)
    state = ref.zero_state()
    return np.stack([ref.step(t, state).numpy() for t in tokens])


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    out = tmp_path_factory.mktemp("growing-ring")
    return {w: export(toy(w), out, quant="fp32", gate=False, progress=False, prefill_chunk=CHUNK, name=f"w{w}").path
            for w in WINDOWS}  # fmt: skip


def runner(bundle, start: int = START, **kw) -> Runner:
    r = Runner(bundle, **kw)
    r.kv_start = start
    r.reset()
    return r


def test_the_manifest_declares_the_rings_growing_up_to_the_window(bundles):
    with Runner(bundles[40]) as r:
        m = r.bundle.manifest
        rings = [s for s in m.states if s.name in RINGS]
        assert [(s.shape[3], s.max_context, s.window, s.full_shape[3]) for s in rings] == [(-1, 40, 40, 40)] * 2
        assert m.context == 256  # the full-attention cache alone bounds the context
        assert m.fixed_state_bytes == 2 * (2 * 2 * 40 * 12 * 4)  # the rings at their whole window


def test_the_ring_grows_with_the_tokens_and_stops_at_the_window(bundles):
    with runner(bundles[40], prefill=False) as r:
        seen = []
        for t in prompt(100, r.vocab_size):
            r.step(t)
            seen.append(r.ring_slots)
        assert r.state(RINGS[0]).shape[3] == 40
    assert [seen[n - 1] for n in (1, 8, 9, 16, 17, 32, 33, 40, 41, 100)] == [8, 8, 16, 16, 32, 32, 40, 40, 40, 40]


def decode_at(bundle, held: int):
    """(ops of one decode call, its logits, the ring slots allocated) after `held` tokens."""
    log = OpLog()
    with Runner(bundle, prefill=False, profiler=log.profiler()) as r:
        r.kv_start = START
        r.reset()
        r.feed(prompt(held, r.vocab_size))
        logits = r.step(7)
        return summarize(log.calls[-1]), logits, r.ring_slots


def test_decode_work_does_not_grow_with_the_window(bundles):
    """10 tokens held: a ring of 16 slots at both windows, the same ops, the same logits."""
    (small_ops, small_logits, small_slots), (big_ops, big_logits, big_slots) = (decode_at(bundles[w], 10) for w in WINDOWS)
    assert small_slots == big_slots == 16
    assert small_ops.ops == big_ops.ops and small_ops.by_type == big_ops.by_type
    np.testing.assert_array_equal(small_logits, big_logits)


@pytest.mark.parametrize("window", WINDOWS)
def test_decode_across_the_growth_and_the_wrap_equals_the_reference(bundles, window):
    """The M=1 loop through 8 -> 16 -> 32 -> 64 -> W slots and 2.5 windows (wrapping twice),
    against the reference and a ring allocated whole from the start."""
    model = toy(window)
    tokens = prompt(2 * window + window // 2, model.config.vocab_size)
    want = reference_logits(model, tokens)
    with runner(bundles[window], prefill=False) as grown, runner(bundles[window], start=window, prefill=False) as whole:
        got, full = grown.step_each(tokens), whole.step_each(tokens)
        assert grown.ring_slots == whole.ring_slots == window
        for name in RINGS:
            np.testing.assert_allclose(grown.state(name), whole.state(name), atol=1e-6)
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5
    assert np.abs(got - full).max() <= 1e-5


@pytest.mark.parametrize("n", (5, 20, 39, 41, 47, 48, 60, 100, 130))
def test_prefill_across_the_growth_equals_the_m1_loop(bundles, n):
    """Chunks of 48 at W = 40: inside a small ring, growing it, crossing to the full window
    (n = 41, 47, 60: the first chunk), longer than W (48 at once), and wrapping (100, 130);
    then decode steps on, each against the M=1 loop."""
    bundle = bundles[40]
    with runner(bundle) as fast, runner(bundle, prefill=False) as slow:
        tokens, then = prompt(n, fast.vocab_size), prompt(5, fast.vocab_size, seed=3)
        a, b = fast.feed(tokens), slow.feed(tokens)
        assert np.abs(a - b).max() <= 1e-4
        assert fast.ring_slots == slow.ring_slots
        for name in RINGS:
            np.testing.assert_allclose(fast.state(name), slow.state(name), atol=1e-5)
        for t in then:
            assert np.abs(fast.step(t) - slow.step(t)).max() <= 1e-4


def test_snapshot_and_rewind_across_the_growth(bundles, tmp_path):
    """A snapshot at 10 tokens (16 slots) holds the whole window, zero past the tokens; restored
    after the ring grew to W and wrapped, it decodes the very logits again. A rewind from past
    a growth back to a mark taken before it does the same."""
    from ssmport.runtime.snapshot import StateSnapshot

    with runner(bundles[40], prefill=False) as r:
        r.feed(prompt(10, r.vocab_size))
        snap = r.snapshot()
        assert r.ring_slots == 16 and snap.states[RINGS[0]].shape == (2, 1, 2, 40, 12)
        assert not snap.states[RINGS[0]][:, :, :, 10:].any()
        then = prompt(70, r.vocab_size, seed=1)
        after = r.step_each(then)
        assert r.ring_slots == 40
        r.restore(StateSnapshot.load(snap.save(tmp_path / "ring.safetensors")))
        assert r.ring_slots == 16 and r.tokens == list(snap.tokens)
        np.testing.assert_array_equal(r.step_each(then), after)

        r.restore(snap)
        mark = r.mark()
        r.step_each(prompt(20, r.vocab_size, seed=2))  # 30 tokens: 32 slots
        r.rewind(mark)
        np.testing.assert_array_equal(r.step_each(then), after)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """RecurrentGemma's tiny preset at a window of 24 (rings and no KV cache: the growing
    functions' dims are the rings' alone), prefill chunks of 16."""
    model = load_model("recurrentgemma-tiny", synthetic=True)
    config = dataclasses.replace(model.config, window=24)
    model = dataclasses.replace(model, config=config, weights=model.architecture.synthetic_weights(config, 0))
    out = tmp_path_factory.mktemp("gemma-ring")
    return model, export(model, out, quant="fp32", gate=False, progress=False, prefill_chunk=16).path


def test_recurrent_gemma_across_the_growth_equals_the_reference_and_the_m1_loop(gemma):
    """Slots 4 -> 8 -> 16 -> 24 and two wraps: the M=1 loop against the reference; prefill
    chunks growing the ring, crossing to the full window and wrapping, against the loop."""
    model, bundle = gemma
    tokens = prompt(60, model.config.vocab_size)
    want = reference_logits(model, tokens)
    with runner(bundle, start=4, prefill=False) as slow, runner(bundle, start=4) as fast:
        got = slow.step_each(tokens)
        assert slow.ring_slots == 24 and slow.kv_positions is None
        assert np.abs(got - want).max() / np.abs(want).max() < 1e-5
        for n in (3, 7, 20, 60):
            fast.reset()
            np.testing.assert_allclose(fast.feed(tokens[:n]), got[n - 1], atol=1e-4)
            assert fast.ring_slots == min(24, max(4, 1 << (n - 1).bit_length()))
