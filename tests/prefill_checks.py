"""Checks every architecture's chunked prefill is held to (tests/test_prefill.py, test_mamba2_prefill.py).

Prompt lengths 1, T-1, T, T+1 and 3T+5 cover a single padded chunk, an exact chunk, a
chunk plus one, and several chunks with a short tail (T = 8 keeps the tests fast).
"""

from __future__ import annotations

import numpy as np
import torch

from ssmport.runtime import Runner, StateSnapshot

CHUNK = 8
LENGTHS = (1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5)
FP16_ULP = 2.0**-10  # one ulp of an fp16 logit, relative: two runs whose fp32 logits differ by
# the 1e-4 these checks allow may round to neighbouring fp16 values (the apple layout's logits)


def logits_bound(runner: Runner, want: np.ndarray) -> np.ndarray:
    """The 1e-4 prefill and the M=1 loop may differ by, plus an ulp where the logits are fp16."""
    fp16 = runner.bundle.manifest.main.outputs[0].dtype == "float16"
    return 1e-4 + (np.abs(want) * FP16_ULP if fp16 else 0.0)


def prompt(n: int, vocab: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed + n).integers(0, vocab, size=n).tolist()


def run_prefill(module, tokens: list[int], pad: int = 0, T: int = CHUNK) -> torch.Tensor:
    """Zero the eager prefill module's states, feed `tokens` in chunks of T (the last one
    padded with `pad`), return the last logits [V]."""
    for name, _ in module.named_buffers():
        getattr(module, name).zero_()
    with torch.no_grad():
        for start in range(0, len(tokens), T):
            chunk = tokens[start : start + T]
            ids = torch.full((1, T), pad, dtype=torch.int32)
            ids[0, : len(chunk)] = torch.tensor(chunk)
            positions = torch.arange(start, start + T, dtype=torch.int32).view(1, T)  # attention reads them
            logits = module(ids, positions, torch.tensor([len(chunk)], dtype=torch.int32))
    return logits.view(-1)


def assert_coreai_prefill_equals_m1_loop(bundle_path, n: int, then: tuple[int, ...] = (3,), chunk: int = CHUNK,
                                        rows: int | None = None) -> None:  # fmt: skip
    """On the Core AI runtime: prefill's last logits and states vs `main` fed one by one,
    then the decode steps `then` from the state each left. `rows`: prefill calls of that many
    tokens (the apple layout's prefill takes any count up to its bound `chunk`)."""
    with Runner(bundle_path, prefill=True) as fast, Runner(bundle_path, prefill=False) as slow:
        assert fast.has_prefill and fast.prefill_chunk == chunk and not slow.has_prefill
        fast.prefill_chunk = rows or chunk
        tokens = prompt(n, fast.vocab_size)
        got, want = fast.feed(tokens), slow.feed(tokens)
        assert got.shape == want.shape == (fast.vocab_size,)
        assert (np.abs(got - want) <= logits_bound(fast, want)).all()
        for name in fast.state_names:
            assert np.abs(fast.state(name) - slow.state(name)).max() <= 1e-4
        assert fast.tokens == slow.tokens == tokens
        # decoding continues from the state prefill left
        for t in then:
            got, want = fast.step(t), slow.step(t)
            assert (np.abs(got - want) <= logits_bound(fast, want)).all()


def assert_snapshot_restores(bundle_path, first: list[int], then: list[int], meanwhile: list[int], path):
    """On the Core AI runtime: a snapshot taken after `first`, saved to `path` and restored after
    `meanwhile` was fed, decodes `then` to the very logits and states the first run did.
    Returns the snapshot (callers check what it holds)."""
    with Runner(bundle_path) as runner:
        runner.feed(first)
        snap = runner.snapshot()
        cold = [runner.step(t) for t in then]
        cold_states = {n: runner.state(n) for n in runner.state_names}
        runner.feed(meanwhile)  # leave other values in the states
        runner.restore(StateSnapshot.load(snap.save(path)))
        assert runner.tokens == first
        warm = [runner.step(t) for t in then]
        for a, b in zip(cold, warm):
            np.testing.assert_array_equal(a, b)
        for n in runner.state_names:
            np.testing.assert_array_equal(cold_states[n], runner.state(n))
    return snap


def eager_modules(model):
    """The fp32 eager decode module and the prefill module built on it (shared weights)."""
    from ssmport.quant import get_recipe
    from ssmport.quant.plan import WeightBuilder

    arch = model.architecture
    builder = WeightBuilder(get_recipe("fp32"), arch.keeps_float)
    with torch.no_grad():
        decode = arch.build_decode(model.config, model.weights, builder, torch.float32).eval()
        return decode, arch.build_prefill(model.config, decode, CHUNK).eval()


def reference_run(model, tokens: list[int]):
    """The plain reference loop over `tokens` from a zero state: (last logits [V], state)."""
    ref = model.architecture.reference(model.config, model.weights)
    state = ref.zero_state()
    for t in tokens:
        logits = ref.step(t, state)
    return logits, state


def prefill_vs_reference(model, n: int):
    """The eager prefill module and the reference loop on the same n-token prompt, last
    logits checked (rel < 1e-5); returns (module, reference state) for state checks."""
    module = eager_modules(model)[1]
    tokens = prompt(n, model.config.vocab_size)
    got = run_prefill(module, tokens)
    want, state = reference_run(model, tokens)
    assert float((got - want).abs().max()) / float(want.abs().max()) < 1e-5
    return module, state


def padded_outputs_agree(model, real: list[int]) -> None:
    """Same real tokens, padding ids 0 and 7: identical logits and states."""
    module = eager_modules(model)[1]
    outs = []
    for pad in (0, 7):
        logits = run_prefill(module, real, pad=pad)
        outs.append([logits.clone(), *(b.clone() for b in module.buffers())])
    for a, b in zip(*outs):
        assert torch.equal(a, b)
