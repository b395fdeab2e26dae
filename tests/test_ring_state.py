"""The sliding-window ("ring") state kind end to end, on the test-only model tests/ringtoy.py.

Window W = 6 and streams several windows long, so the ring wraps many times: the slot
arithmetic against python's %, transformers' window semantics, decode and chunked prefill
(chunks shorter and longer than W) against the plain reference loop, the ring's contents
against the naive write, the manifest's kinds and sizes, the Core AI bundle against the
reference and its own M=1 loop, and a snapshot across a wrap. (One write per state per call is
checked by every export: contract.read_signature counts each state's write_handle ops.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from prefill_checks import CHUNK, LENGTHS, assert_coreai_prefill_equals_m1_loop, assert_snapshot_restores, prompt, run_prefill
from ringtoy import RINGTOY, RingToyConfig

from ssmport.architectures import LoadedModel
from ssmport.bundle import Bundle
from ssmport.errors import BundleError
from ssmport.exporter.pipeline import export
from ssmport.manifest import StateEntry
from ssmport.ops import sliding
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.runtime import Runner
from ssmport.state import RING, StateSpec

CFG = RingToyConfig()
W = CFG.window
STREAM = 7 * W + 3  # seven wraps and a bit


def toy_model() -> LoadedModel:
    return LoadedModel(RINGTOY, CFG, RINGTOY.synthetic_weights(CFG, 0), {"kind": "synthetic", "preset": "ringtoy-tiny",
                       "seed": 0}, name="ringtoy-tiny")  # fmt: skip


def reference_run(tokens):
    ref = RINGTOY.reference(CFG, toy_model().weights)
    state = ref.zero_state()
    return torch.stack([ref.step(t, state) for t in tokens]), state


def naive_ring(rows: list[torch.Tensor]) -> torch.Tensor:
    """The ring [kv_heads, W, d] the naive write leaves after every row [kv_heads, d] in order."""
    ring = torch.zeros(CFG.kv_heads, W, CFG.head_dim)
    sliding.write_naive(ring, torch.stack(rows, 1), list(range(len(rows))))
    return ring


def rel(got, want) -> float:
    return float((got - want).abs().max()) / float(want.abs().max())


@pytest.fixture(scope="module")
def modules():
    model = toy_model()
    builder = WeightBuilder(get_recipe("fp32"), RINGTOY.keeps_float)
    with torch.no_grad():
        decode = RINGTOY.build_decode(CFG, model.weights, builder, torch.float32).eval()
        return decode, {T: RINGTOY.build_prefill(CFG, decode, T).eval() for T in (4, CHUNK)}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("ring")
    return export(toy_model(), out, quant="fp32", gate=False, progress=False, prefill_chunk=CHUNK).path


def test_ring_slot_is_python_modulo():
    for window in (1, 5, 6, 8, 256, 2048):
        p = torch.cat([torch.arange(-3 * window, 5000), torch.tensor([2**20 - 1, 2**20 + 7, 3_999_999])]).to(torch.int32)
        assert sliding.ring_slot(p, window).tolist() == [int(x) % window for x in p]


@pytest.mark.parametrize("start, T, valid", [(0, 1, None), (13, 1, None), (0, 4, 4), (5, 4, 3), (3, 8, 8), (20, 8, 7), (2, 17, 17)])
def test_the_blend_leaves_the_ring_the_scatter_leaves(start, T, valid):
    """sliding.blend (the apple layout's write: no scatter, static W slots) against sliding.write
    (the index_copy) and the naive per-row write, decode and chunks shorter and longer than W."""
    from ssmport.ops.rows import blend_at, blend_at_naive

    g = torch.Generator().manual_seed(start * 31 + T)
    ring = torch.randn(3, 1, 2, W, 5, generator=g)
    rows = [torch.randn(2, T, 5, generator=g) for _ in range(3)]
    positions = torch.arange(start, start + T, dtype=torch.int32)
    valid_len = None if valid is None else torch.tensor([valid], dtype=torch.int32)
    scattered, blended = ring.clone(), ring.clone()
    sliding.write(scattered, rows, positions, valid_len)
    sliding.blend(blended, rows, positions, valid_len)
    assert torch.equal(blended, scattered)
    n = valid or 1
    for layer, r in enumerate(rows):
        naive = ring[layer, 0].clone()
        sliding.write_naive(naive, r[:, :n], list(range(start, start + n)))
        assert torch.equal(blended[layer, 0], naive)
    hit, offset = torch.tensor([True, False] * 3)[:W], torch.tensor([0, 5, T - 1, -2, 0, 9])[:W] % T
    a, b = ring.clone(), ring.clone()
    blend_at(a, rows, hit, offset)
    blend_at_naive(b, rows, hit, offset)
    assert torch.equal(a, b)


def test_window_semantics_are_transformers():
    """A token at position p sees p-W+1 .. p (transformers' sliding_window_overlay)."""
    from transformers.masking_utils import sliding_window_overlay

    seen = [[kv for kv in range(20) if kv <= q and sliding_window_overlay(W)(0, 0, q, kv)] for q in range(20)]
    assert seen == [list(range(max(0, q - W + 1), q + 1)) for q in range(20)]
    # the ring: before a token at p, the slots it may read hold exactly p-W+1 .. p-1
    for p in range(20):
        held = sliding.slot_positions(torch.tensor([p]), W)
        visible = sorted(int(h) for h in held if 0 <= h > p - W)
        assert visible == list(range(max(0, p - W + 1), p))


def test_state_kinds_and_sizes(modules):
    decode, _ = modules
    assert [(s.name, s.kind, s.shape) for s in decode.specs] == [
        ("keyCache", "kv", (1, 1, CFG.kv_heads, CFG.context, CFG.head_dim)),
        ("valueCache", "kv", (1, 1, CFG.kv_heads, CFG.context, CFG.head_dim)),
        ("slidingKeyCache", "ring", (2, 1, CFG.kv_heads, W, CFG.head_dim)),
        ("slidingValueCache", "ring", (2, 1, CFG.kv_heads, W, CFG.head_dim)),
    ]
    assert [s.window for s in decode.specs] == [None, None, W, W] and decode.specs[2].context is None
    with pytest.raises(ValueError, match=r"ring state r must be \[layers, 1, heads, window, head_dim\]"):
        StateSpec("r", (2, 1, 2, 6), torch.float32, "", RING)
    with pytest.raises(BundleError, match="ring state r must be"):
        StateEntry.from_json({"name": "r", "shape": [2, 1, 6, 12], "dtype": "float32", "kind": "ring"}, "m")


def test_decode_matches_the_reference_and_the_naive_ring(modules):
    decode, _ = modules
    tokens = prompt(STREAM, CFG.vocab_size)
    for b in decode.buffers():
        b.zero_()
    with torch.no_grad():
        got = torch.stack([decode(torch.tensor([[t]], dtype=torch.int32), torch.tensor([[p]], dtype=torch.int32)).view(-1)
                           for p, t in enumerate(tokens)])  # fmt: skip
    want, state = reference_run(tokens)
    assert rel(got, want) < 1e-5
    for slot, layer in enumerate((0, 2)):
        assert torch.allclose(decode.slidingKeyCache[slot, 0], naive_ring(state["K"][layer]), atol=1e-6)
        assert torch.allclose(decode.slidingValueCache[slot, 0], naive_ring(state["V"][layer]), atol=1e-6)


@pytest.mark.parametrize("T", (4, CHUNK))  # shorter and longer than the window
@pytest.mark.parametrize("n", (1, W - 1, W, W + 1, 2 * W + 1, 4, 9, 3 * CHUNK + 5))
def test_prefill_matches_the_reference(modules, T, n):
    prefill = modules[1][T]
    tokens = prompt(n, CFG.vocab_size)
    logits = run_prefill(prefill, tokens, T=T)
    want, state = reference_run(tokens)
    assert rel(logits, want[-1]) < 1e-5
    for slot, layer in enumerate((0, 2)):  # every slot exact, also where a chunk wrapped the ring
        assert torch.allclose(prefill.slidingKeyCache[slot, 0], naive_ring(state["K"][layer]), atol=1e-6)
        assert torch.allclose(prefill.slidingValueCache[slot, 0], naive_ring(state["V"][layer]), atol=1e-6)


def test_bundle_records_the_kinds(bundle):
    m = Bundle.open(bundle).manifest
    assert [(s.name, s.kind, s.window) for s in m.states] == [
        ("keyCache", "kv", None), ("valueCache", "kv", None),
        ("slidingKeyCache", "ring", W), ("slidingValueCache", "ring", W)]  # fmt: skip
    assert m.context == CFG.context  # the full-attention cache alone bounds the context
    ring_bytes = 2 * (2 * CFG.kv_heads * W * CFG.head_dim * 4)
    assert m.fixed_state_bytes == ring_bytes and m.kv_bytes_per_token == 2 * CFG.kv_heads * CFG.head_dim * 4


def test_coreai_matches_the_reference(bundle):
    tokens = prompt(STREAM, CFG.vocab_size)
    want, state = reference_run(tokens)
    with Runner(bundle, prefill=False) as runner:
        got = runner.step_each(tokens)
        keys = runner.state("slidingKeyCache")
    assert np.abs(got - want.numpy()).max() / np.abs(want.numpy()).max() < 1e-5
    np.testing.assert_allclose(keys[1, 0], naive_ring(state["K"][2]).numpy(), atol=1e-5)


@pytest.mark.parametrize("n", LENGTHS + (W - 1, W, W + 1))
def test_coreai_prefill_equals_the_m1_loop(bundle, n):
    assert_coreai_prefill_equals_m1_loop(bundle, n)


def test_snapshot_across_a_wrap_restores_exactly(bundle, tmp_path):
    first, then = prompt(2 * W + 3, CFG.vocab_size), prompt(W + 2, CFG.vocab_size, seed=5)  # `then` wraps again
    snap = assert_snapshot_restores(bundle, first, then, prompt(9, CFG.vocab_size, seed=9), tmp_path / "r.safetensors")
    assert snap.states["slidingKeyCache"].shape == (2, 1, CFG.kv_heads, W, CFG.head_dim)  # the whole ring


def test_inspect_names_the_rings(bundle, capsys):
    from ssmport.cli.main import main

    assert main(["inspect", str(bundle)]) == 0
    out = capsys.readouterr().out
    ring_bytes = 2 * 2 * CFG.kv_heads * W * CFG.head_dim * 4
    assert f"sliding window: slidingKeyCache, slidingValueCache are rings of {W} positions, {ring_bytes / 1024:.1f} KB" in out
    assert f"kv cache: {CFG.context} positions" in out


# -- the apple layout (docs/apple-engines.md, section 8, "Sliding-window rings") --------------------

FP16_ROUNDING = 2.0**-11  # the apple layout's logits are fp16: round to nearest, half an ulp of each logit


@pytest.fixture(scope="module")
def apple_bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("ring-apple")
    return export(toy_model(), out, quant="fp32", gate=False, progress=False, layout="apple").path


def test_apple_layout_keeps_both_rings_as_one_sliding_cache(apple_bundle, capsys):
    import json

    from ssmport.cli.main import main

    m = Bundle.open(apple_bundle).manifest
    assert [(s.name, s.kind, s.shape) for s in m.states] == [
        ("keyCache", "kv", (1, 1, CFG.kv_heads, -1, CFG.head_dim)), ("valueCache", "kv", (1, 1, CFG.kv_heads, -1, CFG.head_dim)),
        ("slidingCache", "ring", (4, 1, CFG.kv_heads, W, CFG.head_dim))]  # fmt: skip
    assert m.states[2].window == W  # static: the ring's W slots, whatever the context
    meta = json.loads((apple_bundle / "metadata.json").read_text())
    assert meta["language"]["states"] == {"keyCache": "kv_cache", "valueCache": "kv_cache", "slidingCache": "sliding_cache"}
    assert main(["inspect", str(apple_bundle)]) == 0
    ring_bytes = 4 * CFG.kv_heads * W * CFG.head_dim * 4
    out = capsys.readouterr().out
    assert f"sliding window: slidingCache holds rings of {W} positions, {ring_bytes / 1024:.1f} KB" in out
    # the tokens' dynamic axis has no size until a call (it printed -4 B)
    assert not [line for line in out.splitlines() if " -" in line and line.rstrip().endswith(" B")]
    assert any(line.split()[:2] == ["input", "position_ids"] and line.split()[-2:] == ["per", "call"] for line in out.splitlines())


def test_apple_bundle_matches_the_reference_and_the_default_bundle(apple_bundle, bundle):
    """Logits within the default test's 1e-5 of scale plus the fp16 rounding of Apple's logits;
    the ring rows (keys of layer 0 and 2, then values) exactly as the default test wants them."""
    tokens = prompt(STREAM, CFG.vocab_size)
    want, state = reference_run(tokens)
    want = want.numpy()
    with Runner(apple_bundle, prefill=False) as runner:
        got = runner.step_each(tokens)
        ring = runner.state("slidingCache")
    with Runner(bundle, prefill=False) as runner:
        default = runner.step_each(tokens)
    scale = np.abs(want).max()
    assert (np.abs(got - want) <= np.abs(want) * FP16_ROUNDING + 1e-5 * scale).all()
    assert (np.abs(got - default) <= np.abs(default) * FP16_ROUNDING + 1e-5 * scale).all()
    assert (got.argmax(-1) == want.argmax(-1)).all()
    for row, (kv, layer) in enumerate((("K", 0), ("K", 2), ("V", 0), ("V", 2))):
        np.testing.assert_allclose(ring[row, 0], naive_ring(state[kv][layer]).numpy(), atol=1e-5)


@pytest.mark.parametrize("rows, n", [(4, W - 1), (4, W + 1), (4, 2 * W + 1), (8, W + 1), (8, 3 * 8 + 5), (None, 47)])
def test_apple_prefill_equals_the_m1_loop(apple_bundle, rows, n):
    """Prefill calls of 4 and 8 rows (shorter and longer than the window: a call wraps the
    ring), and of 46 (the bound, 48, minus the token held back for main)."""
    assert_coreai_prefill_equals_m1_loop(apple_bundle, n, chunk=CFG.context, rows=rows)


def test_apple_snapshot_across_a_wrap_restores_exactly(apple_bundle, tmp_path):
    first, then = prompt(2 * W + 3, CFG.vocab_size), prompt(W + 2, CFG.vocab_size, seed=5)
    snap = assert_snapshot_restores(apple_bundle, first, then, prompt(9, CFG.vocab_size, seed=9), tmp_path / "r.safetensors")
    assert snap.states["slidingCache"].shape == (4, 1, CFG.kv_heads, W, CFG.head_dim)  # both rings whole


def test_check_engine_names_the_ring_rewind_when_no_state_is_fixed(apple_bundle, capsys):
    """kv, kv, sliding: no fixed state, so the engines rewind by moving the cursor, which a ring
    of W slots survives only for one token: check-engine says so for every dynamic engine."""
    from ssmport.cli.main import main

    main(["check-engine", str(apple_bundle)])
    out = capsys.readouterr().out
    assert out.count("states.ring_rewind [misdrives]") == 4  # sequential and pipelined, 86b363d and prefill-graph


def test_the_decode_mask_is_the_slot_arithmetic():
    """sliding.decode's mask (slot j < position, not the slot it overwrites) against attention
    over the slots `slot_positions` says hold a visible position, whole rings and growing ones
    (S < W slots while position <= S), across wraps."""
    from ssmport.ops import attention

    g = torch.Generator().manual_seed(3)
    for window in (W, 40):
        for slots in sorted({window, min(8, window), min(16, window)}):
            K, V = torch.randn(2, slots, 4, generator=g), torch.randn(2, slots, 4, generator=g)
            q, k, v = torch.randn(4, 4, generator=g), torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g)
            for p in range(0, 3 * window if slots == window else slots):
                position = torch.tensor([p])
                held = sliding.slot_positions(position, window, slots)
                want = attention.decode(q, k, v, K, V, position, 0.5, past=(held >= 0) & (held > p - window))
                torch.testing.assert_close(sliding.decode(q, k, v, K, V, position, 0.5, window), want, rtol=0, atol=0)
