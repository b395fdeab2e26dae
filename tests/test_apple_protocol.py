"""Apple's engines' driving protocol, emulated over toy models, against the plain token loop.

A conversation is driven turn by turn through the emulated engine exactly as the FoundationModels
adapter does (the whole transcript re-sent each turn); every turn's generated ids must equal a
plain loop that starts from zero states and feeds the same transcript one token at a time.
Where Apple's code at a revision loses a token or rewinds a recurrent state by a cursor, the
emulation reproduces it, and the tests say so.
"""

from __future__ import annotations

import numpy as np
import pytest
from apple_toys import ATTENTION, HYBRID, RECURRENT_2, RECURRENT_3, VOCAB, ToyModel, reference_generate, toy_bundle

from apple_protocol import (
    EngineError,
    PipelinedEngine,
    SequentialEngine,
    common_prefix,
    prefill_chunk_sizes,
    prefix_reset_plan,
)
from ssmport.apple.sources import MAIN_86B363D, PRE_HYBRID, PREFILL_GRAPH

NOW, LATER = MAIN_86B363D, PREFILL_GRAPH
MAX_NEW = 12


def user_turns(seed: int, lengths=(30, 5, 19, 1, 40)) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(1, VOCAB, n)] for n in lengths]


def stop_for(model: ToyModel, first_prompt: list[int]) -> set[int]:
    """A stop id this model reaches early on its first turn, so replies end by stopping."""
    return {reference_generate(model, first_prompt, MAX_NEW, set(), 512)[3]}


def echo(reply: list[int]) -> list[int]:
    return reply  # the template renders the reply as generated, stop id included


def rerender(reply: list[int]) -> list[int]:
    return [t for t in reply[:-1]] + [VOCAB - 1]  # another end-of-turn token than the one generated


def converse(engine, model: ToyModel, turns, stop: set[int], render, **kwargs) -> list[tuple[list[int], list[int]]]:
    """Drive the turns; return each turn's (engine ids, plain-loop ids)."""
    transcript: list[int] = []
    results = []
    for user in turns:
        prompt = transcript + user
        got = engine.generate(prompt, max_tokens=MAX_NEW, stop_ids=stop, **kwargs)
        want = reference_generate(model, prompt, MAX_NEW, stop, engine.max_context)
        results.append((got, want))
        transcript = prompt + render(want)
    return results


def assert_matches(results) -> None:
    for turn, (got, want) in enumerate(results):
        assert got == want, f"turn {turn}: {got} != {want}"


# -- pieces -----------------------------------------------------------------------------------------


def test_prefill_chunk_sizes() -> None:
    assert prefill_chunk_sizes(1, 512, 1) == [] and prefill_chunk_sizes(0, 512, 0) == []
    assert prefill_chunk_sizes(5, 512, 1) == [4]
    assert prefill_chunk_sizes(1100, 512, 1) == [367, 366, 366]  # balanced: none below half the width
    assert prefill_chunk_sizes(1100, 512, 1, balanced=False) == [512, 512, 75]
    assert prefill_chunk_sizes(1024, 512, 0) == [512, 512]
    for n in range(1, 200):
        sizes = prefill_chunk_sizes(n, 16, 1)
        assert sum(sizes) == n - 1 and (not sizes or max(sizes) - min(sizes) <= 1 and max(sizes) <= 16)
        assert len(sizes) == len(prefill_chunk_sizes(n, 16, 1, balanced=False))


def test_prefix_reset_plan_is_the_engines_four_way_routing() -> None:
    # (common, history, processed, input count, has a fixed state) -> rewind to
    assert prefix_reset_plan(10, 10, 10, 15, True) is None  # extension: continue
    assert prefix_reset_plan(8, 10, 10, 15, True) == 0  # divergence: full reset
    assert prefix_reset_plan(10, 10, 10, 10, True) == 0  # the same input again: full reset
    assert prefix_reset_plan(8, 10, 10, 15, False) == 0  # divergence, KV only: full reset too
    assert prefix_reset_plan(10, 10, 10, 10, False) == 9  # the same input, KV only: back one token
    assert prefix_reset_plan(6, 10, 10, 6, False) == 5  # a shorter input, KV only: back to it
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([], [1]) == 0


# -- the sequential engine ---------------------------------------------------------------------------


@pytest.mark.parametrize("layout", [RECURRENT_3, HYBRID, ATTENTION], ids=["recurrent", "hybrid", "attention"])
@pytest.mark.parametrize("revision", [NOW, LATER])
@pytest.mark.parametrize("render", [echo, rerender])
def test_sequential_conversation_equals_the_plain_loop(layout, revision, render) -> None:
    model = ToyModel(layout, seed=3)
    turns = user_turns(4)
    engine = SequentialEngine(toy_bundle(layout), model, revision=revision, chunk_threshold=8, kv_initial=4)
    assert_matches(converse(engine, model, turns, stop_for(model, turns[0]), render))
    if layout.kv:
        assert engine.states.capacity > 4  # the KV caches grew and kept their rows


def test_sequential_calls_at_each_revision() -> None:
    model = ToyModel(RECURRENT_3, seed=1)
    prompt = user_turns(0, (30,))[0]
    later = SequentialEngine(toy_bundle(RECURRENT_3), model, revision=LATER, chunk_threshold=8)
    later.generate(prompt, max_tokens=3)
    # Balanced prefill chunks over all but the last token, which goes through main; then decode.
    assert [(c.function, len(c.tokens), c.positions) for c in later.calls] == [
        ("prefill", 8, 8), ("prefill", 7, 15), ("prefill", 7, 22), ("prefill", 7, 29),
        ("main", 1, 30), ("main", 1, 31), ("main", 1, 32)]
    now = SequentialEngine(toy_bundle(RECURRENT_3), model, revision=NOW, chunk_threshold=8)
    now.generate(prompt, max_tokens=2)
    # 86b363d never calls `prefill`: prompts over the threshold go through main in full chunks.
    assert [(c.function, len(c.tokens)) for c in now.calls] == [("main", 8), ("main", 8), ("main", 8), ("main", 6), ("main", 1)]
    short = SequentialEngine(toy_bundle(RECURRENT_3, prefill=False), model, revision=LATER)
    short.generate(prompt, max_tokens=1)
    assert [(c.function, len(c.tokens)) for c in short.calls] == [("main", 30)]  # below the threshold: one batch


def test_sequential_regenerate_resets_a_recurrent_model_and_rewinds_an_attention_one() -> None:
    for layout, first_call in ((RECURRENT_3, ("prefill", 8)), (ATTENTION, ("main", 1))):
        model = ToyModel(layout, seed=5)
        prompt = user_turns(6, (9,))[0]
        engine = SequentialEngine(toy_bundle(layout), model, revision=LATER, chunk_threshold=8)
        first = engine.generate(prompt, max_tokens=4)
        engine.calls.clear()
        assert engine.generate(prompt, max_tokens=4) == first == reference_generate(model, prompt, 4, set(), 512)
        call = engine.calls[0]
        assert (call.function, len(call.tokens)) == first_call  # a full replay, or the last token again


def test_the_legacy_two_state_rule_corrupts_a_regenerated_reply() -> None:
    # 86b363d takes any two states as a KV pair: a re-sent prompt rewinds the cursor one token
    # and feeds it again on top of the recurrent state. Three states, or the later revision: exact.
    prompt = user_turns(8, (12,))[0]
    for layout, revision, exact in ((RECURRENT_2, NOW, False), (RECURRENT_3, NOW, True), (RECURRENT_2, LATER, True)):
        model = ToyModel(layout, seed=9)
        engine = SequentialEngine(toy_bundle(layout), model, revision=revision)
        want = reference_generate(model, prompt, MAX_NEW, set(), 512)
        assert engine.generate(prompt, max_tokens=MAX_NEW) == want
        assert (engine.generate(prompt, max_tokens=MAX_NEW) == want) == exact, (layout, revision)


def test_sequential_respects_the_context_limit() -> None:
    model = ToyModel(RECURRENT_3, seed=2)
    engine = SequentialEngine(toy_bundle(RECURRENT_3, max_context=40), model)
    assert len(engine.generate(user_turns(1, (35,))[0], max_tokens=100)) == 5


# -- the pipelined engine -----------------------------------------------------------------------------


@pytest.mark.parametrize("overrun, seen", [(0, 0), (1, 0), (1, 1), (2, 0), (2, 1), (3, 3)])
@pytest.mark.parametrize("render", [echo, rerender])
def test_pipelined_hybrid_conversation_equals_the_plain_loop(overrun, seen, render) -> None:
    model = ToyModel(HYBRID, seed=3)
    turns = user_turns(4)
    engine = PipelinedEngine(toy_bundle(HYBRID), model, revision=LATER, chunk_threshold=8, kv_initial=4)
    assert_matches(converse(engine, model, turns, stop_for(model, turns[0]), render, overrun=overrun, overrun_seen=seen))


@pytest.mark.parametrize("overrun, seen", [(1, 0), (1, 1), (2, 0), (3, 1)])
def test_pipelined_86b363d_is_exact_when_the_pipeline_ran_past_the_stop(overrun, seen) -> None:
    # Every reply ends at a stop id (half the vocab stops), and the engine ran past it.
    model = ToyModel(HYBRID, seed=3)
    stop = set(range(VOCAB // 2, VOCAB))
    engine = PipelinedEngine(toy_bundle(HYBRID), model, revision=NOW, chunk_threshold=8)
    results = converse(engine, model, user_turns(4), stop, echo, overrun=overrun, overrun_seen=seen)
    assert all(want[-1] in stop for _, want in results)
    assert_matches(results)


def test_pipelined_86b363d_drops_the_last_token_of_a_reply_it_did_not_run_past() -> None:
    # A reply that ends at the token budget: its last token was yielded but never fed. At
    # 86b363d the next turn skips it (the history says it is there); the later revision caps
    # the match at what was processed and feeds it.
    model = ToyModel(HYBRID, seed=3)
    turns = user_turns(4, (20, 6))
    for revision, exact in ((NOW, False), (LATER, True)):
        engine = PipelinedEngine(toy_bundle(HYBRID), model, revision=revision)
        results = converse(engine, model, turns, set(), echo)
        assert results[0][0] == results[0][1] and (results[1][0] == results[1][1]) == exact, revision


def test_pipelined_attention_model_rewinds_by_cursor() -> None:
    model = ToyModel(ATTENTION, seed=7)
    turns = user_turns(2)
    for revision in (PRE_HYBRID, NOW, LATER):
        engine = PipelinedEngine(toy_bundle(ATTENTION, prefill=False), model, revision=revision, chunk_threshold=8)
        assert_matches(converse(engine, model, turns, stop_for(model, turns[0]), rerender, overrun=2, overrun_seen=0))


def test_pipelined_calls_at_each_revision() -> None:
    model = ToyModel(HYBRID, seed=1)
    prompt = user_turns(0, (30,))[0]
    later = PipelinedEngine(toy_bundle(HYBRID), model, revision=LATER, chunk_threshold=8)
    later.generate(prompt, max_tokens=2)
    assert [(c.function, len(c.tokens), c.positions) for c in later.calls] == [
        ("prefill", 8, 8), ("prefill", 7, 15), ("prefill", 7, 22), ("prefill", 7, 29), ("main", 1, 30), ("main", 1, 31)]
    now = PipelinedEngine(toy_bundle(HYBRID), model, revision=NOW, chunk_threshold=8)
    now.generate(prompt, max_tokens=1)
    assert [(c.function, len(c.tokens)) for c in now.calls] == [("main", 8), ("main", 8), ("main", 8), ("main", 6)]


def test_engines_refuse_what_their_guards_refuse() -> None:
    with pytest.raises(EngineError, match="pipelined.kv_pair") as err:
        PipelinedEngine(toy_bundle(RECURRENT_3), ToyModel(RECURRENT_3))
    assert err.value.guards[0].source.path.endswith("CoreAIPipelinedEngine.swift")
    with pytest.raises(EngineError, match="sequential.states"):
        SequentialEngine(toy_bundle(RECURRENT_3), ToyModel(RECURRENT_3), revision=PRE_HYBRID)


def test_a_model_breaking_the_logits_contract_is_caught() -> None:
    class LastRowOnly(ToyModel):
        def call(self, function, inputs, states):
            out = super().call(function, inputs, states)
            return {"logits": out["logits"][:, -1:]} if out else out

    engine = SequentialEngine(toy_bundle(RECURRENT_3, prefill=False), LastRowOnly(RECURRENT_3))
    with pytest.raises(EngineError, match=r"not float16\[1, 5, 61\]"):
        engine.generate([1, 2, 3, 4, 5], max_tokens=1)
