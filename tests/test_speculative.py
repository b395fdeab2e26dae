"""Speculative decoding (ssmport.runtime.speculative): lossless against plain decoding.

- Greedy: id for id the ids of plain decoding (`Runner.generate`), with a scripted drafter
  that is wrong at every draft position in turn (and fully right in between), and with prompt
  lookup; on a pure-recurrent bundle, a hybrid with a KV cache, and both in the apple layout
  (whose KV cache grows: a dynamic position axis).
- The states after every accepted prefix equal the M=1 loop's over the same tokens.
- Sampling: the joint distribution of the first tokens equals the target's (chi-square on a
  small Markov target, with a negative control showing the test sees a biased scheme).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ssmport.cli.main import main
from ssmport.drafters import Draft, LookupDrafter
from ssmport.errors import BundleError, SsmportError
from ssmport.runtime.speculative import SpeculativeDecoder, accept_draft

K = 4
PROMPT = [5, 17, 42, 5, 17, 99, 7, 5, 17]
NEW = 40
STATE_TOL = 1e-4  # the prefill tests' bound: the verify graph is prefill's chunk path


@pytest.fixture(scope="module")
def spec_bundles(world_bundle, blinkdl_pth, bundles, export_fn):
    made = {  # rwkv7: with a (small) World tokenizer, for chat
        "rwkv7": export_fn(world_bundle["pth"], bundles, quant="fp32", gate_steps=4, verify=K, prefill_chunk=None,
                           name="spec-rwkv7"),  # gated: the export checks verify against main
        "qwen3.5": export_fn("qwen3.5-tiny", bundles, synthetic=True, quant="fp32", gate=False, verify=K,
                             prefill_chunk=None, context=96, name="spec-qwen35"),
        "rwkv7-apple": export_fn(blinkdl_pth, bundles, quant="fp32", gate=False, verify=K, layout="apple",
                                 prefill_chunk=None, name="spec-rwkv7-apple"),
        "qwen3.5-apple": export_fn("qwen3.5-tiny", bundles, synthetic=True, quant="fp32", gate=False, verify=K,
                                   layout="apple", prefill_chunk=None, context=96, name="spec-qwen35-apple"),
    }  # fmt: skip
    return {key: r.path for key, r in made.items()}


class ScriptedDrafter:
    """Proposes the true continuation, wrong at draft position (round mod K): every position
    is rejected in turn, and every K-th round is all right (a call drafts K-1 at most)."""

    def __init__(self, truth: list[int], vocab: int):
        self.truth, self.vocab, self.rounds, self.wrong_at = truth, vocab, 0, set()

    def propose(self, context, k, temperature, top_p, rng) -> Draft:
        tokens = list(self.truth[len(context) : len(context) + k])
        bad = self.rounds % K
        self.rounds += 1
        if bad < len(tokens):
            tokens[bad] = (tokens[bad] + 1) % self.vocab
            self.wrong_at.add(bad)
        return Draft(tokens)


class StateChecker:
    """A drafter wrapper that, each round, compares the target's states with the M=1 loop's
    after the same tokens."""

    def __init__(self, inner, runner, reference: list[dict]):
        self.inner, self.runner, self.reference, self.checked = inner, runner, reference, 0

    def propose(self, context, k, temperature, top_p, rng) -> Draft:
        n = len(self.runner.tokens)
        for s in self.runner.bundle.manifest.states:
            got, want = self.runner.state(s.name), self.reference[n][s.name]
            if s.kind == "kv":
                got = got[:, :, :, :n]
            np.testing.assert_allclose(got, want, atol=STATE_TOL, rtol=0, err_msg=f"{s.name} after {n} tokens")
        self.checked += 1
        return self.inner.propose(context, k, temperature, top_p, rng)


def m1_states(path, tokens: list[int]) -> list[dict]:
    """The states after each prefix of `tokens` (index n: after n tokens), fed one by one."""
    from ssmport.runtime import Runner

    with Runner(path, prefill=False) as r:
        states = [None] * (len(tokens) + 1)
        for n, t in enumerate(tokens, 1):
            r._main_call([t]) if r.layout.name == "apple" else r.step(t)
            states[n] = {s.name: (r.state(s.name)[:, :, :, :n] if s.kind == "kv" else r.state(s.name))
                         for s in r.bundle.manifest.states}  # fmt: skip
    return states


@pytest.mark.parametrize("kind", ["rwkv7", "qwen3.5", "rwkv7-apple", "qwen3.5-apple"])
def test_greedy_is_plain_decoding_with_rejections_everywhere(spec_bundles, kind):
    from ssmport.runtime import Runner

    path = spec_bundles[kind]
    with Runner(path) as r:
        assert r.verify_rows == K
        plain = list(r.generate(PROMPT, NEW))
        reference = m1_states(path, PROMPT + plain)
        scripted = ScriptedDrafter(PROMPT + plain, r.vocab_size)
        for drafter in (scripted, LookupDrafter()):
            r.reset()
            checker = StateChecker(drafter, r, reference)
            decoder = SpeculativeDecoder(r, checker)
            assert list(decoder.generate(PROMPT, NEW)) == plain
            assert checker.checked > 1
            # afterwards the runner holds every id, as after plain decoding
            assert r.tokens == PROMPT + plain
            for s in r.bundle.manifest.states:
                held = r.state(s.name)[:, :, :, : len(r.tokens)] if s.kind == "kv" else r.state(s.name)
                np.testing.assert_allclose(held, reference[-1][s.name], atol=STATE_TOL, rtol=0)
        assert scripted.wrong_at == set(range(K - 1))  # a call holds at least one pending row
        st = decoder.stats
        assert st.tokens == NEW and st.target_calls < NEW + 1


def test_bundle_drafter_is_lossless_and_the_draft_is_rewound(spec_bundles):
    """A draft bundle (here: the same weights, so every draft holds) drafting for the target."""
    from ssmport.drafters import BundleDrafter
    from ssmport.runtime import Runner

    path = spec_bundles["rwkv7"]
    with Runner(path) as target, Runner(path) as draft:
        plain = list(target.generate(PROMPT, NEW))
        target.reset()
        decoder = SpeculativeDecoder(target, BundleDrafter(draft))
        assert list(decoder.generate(PROMPT, NEW)) == plain
        st = decoder.stats
        assert st.accepted == st.drafted > 0  # the same model agrees with itself
        assert st.target_calls <= math.ceil(NEW / K) + 2
        assert len(draft.tokens) < len(PROMPT) + NEW  # drafts beyond the accepted context were rewound


def ids_until_full(tokens) -> list[int]:
    """The ids a generator yields before it reports the context full."""
    got = []
    with pytest.raises(SsmportError, match="the context is full"):
        for t in tokens:
            got.append(t)
    return got


@pytest.mark.parametrize("kind", ["qwen3.5", "qwen3.5-apple"])
def test_drafts_stop_at_the_context_where_plain_decoding_does(spec_bundles, kind):
    """Asked for more than the context holds, always-right drafts yield plain decoding's ids up
    to the same point: no verify call asks for rows past the context before plain decoding
    would have stopped."""
    from ssmport.runtime import Runner

    with Runner(spec_bundles[kind]) as r:
        asked = r.context  # more than the context leaves after the prompt
        plain = ids_until_full(r.generate(PROMPT, asked))
        assert len(plain) == r.context - len(PROMPT) + 1  # the last id is yielded, then not fed
        r.reset()
        truth = PROMPT + plain + [0] * asked
        decoder = SpeculativeDecoder(r, ScriptedDrafter(truth, r.vocab_size))
        assert ids_until_full(decoder.generate(PROMPT, asked)) == plain
        assert decoder.stats.accepted > 0


# -- sampling: a small Markov target -------------------------------------------------------------
VOCAB, DEPTH, SAMPLES = 4, 3, 12000
CHI2_FALSE_ALARM = 1e-4  # the chance this test fails on a correct scheme


def _table(seed: int) -> np.ndarray:
    """logits[prev2, prev1] over VOCAB next ids: an order-2 Markov chain."""
    return np.random.default_rng(seed).normal(0, 1.5, (VOCAB, VOCAB, VOCAB)).astype(np.float32)


class MarkovRunner:
    """The Runner interface the decoder drives (tokens, context, step, verify, feed, mark,
    rewind), over an order-2 Markov chain: exact target probabilities are known."""

    verify_rows = K
    context = None  # no kv states: any length

    def __init__(self, table):
        self.table, self.tokens = table, []

    def _logits(self, upto: int) -> np.ndarray:
        return self.table[self.tokens[upto - 2], self.tokens[upto - 1]]

    def feed(self, tokens):
        self.tokens += list(tokens)
        return self._logits(len(self.tokens))

    def step(self, token):
        return self.feed([token])

    def verify(self, tokens):
        start = len(self.tokens)
        self.tokens += list(tokens)
        return np.stack([self._logits(start + i + 1) for i in range(len(tokens))])

    def mark(self):
        return len(self.tokens)

    def rewind(self, mark):
        del self.tokens[mark:]


class RandomDrafter:
    """A stochastic drafter with its own (wrong) distribution q, as a draft bundle samples."""

    def __init__(self, table):
        self.table = table

    def propose(self, context, k, temperature, top_p, rng) -> Draft:
        from ssmport.sampling import sampling_probs

        seq, probs = list(context), []
        for _ in range(k):
            q = sampling_probs(self.table[seq[-2], seq[-1]], temperature, top_p)
            seq.append(int(rng.choice(VOCAB, p=q)))
            probs.append(q)
        return Draft(seq[len(context) :], probs)


def _expected(table, prompt, temperature) -> np.ndarray:
    """The exact joint distribution of the first DEPTH sampled ids, [VOCAB] * DEPTH."""
    from ssmport.sampling import sampling_probs

    joint = np.zeros((VOCAB,) * DEPTH)
    for ids in np.ndindex(*joint.shape):
        seq, p = list(prompt), 1.0
        for t in ids:
            p *= sampling_probs(table[seq[-2], seq[-1]], temperature, 1.0)[t]
            seq.append(t)
        joint[ids] = p
    return joint


def _chi2_pvalue(counts: np.ndarray, expected: np.ndarray) -> float:
    from scipy.stats import chisquare

    return float(chisquare(counts.ravel(), expected.ravel() * counts.sum()).pvalue)


@pytest.mark.parametrize("drafter", ["lookup", "random"])
def test_sampling_keeps_the_target_distribution(drafter):
    table, prompt, temperature = _table(1), [0, 1, 2, 0, 1, 3, 0, 1], 0.8
    draft_table = _table(2) if drafter == "random" else None
    counts = np.zeros((VOCAB,) * DEPTH)
    for seed in range(SAMPLES):
        source = LookupDrafter() if drafter == "lookup" else RandomDrafter(draft_table)
        decoder = SpeculativeDecoder(MarkovRunner(table), source)
        counts[tuple(decoder.generate(prompt, DEPTH, temperature, seed=seed))] += 1
    assert decoder.stats.drafted > 0
    assert _chi2_pvalue(counts, _expected(table, prompt, temperature)) > CHI2_FALSE_ALARM


def test_the_distribution_test_sees_a_biased_scheme():
    """Negative control: accepting a sampled draft always (no p/q test) is detected."""
    table, draft_table, prompt = _table(1), _table(2), [0, 1, 2, 0, 1, 3, 0, 1]
    rng = np.random.default_rng(0)
    counts = np.zeros((VOCAB,) * DEPTH)
    drafter = RandomDrafter(draft_table)
    for _ in range(SAMPLES // 4):
        d = drafter.propose(prompt, DEPTH, 0.8, 1.0, rng)  # always kept: the draft's own distribution
        counts[tuple(d.tokens)] += 1
    assert _chi2_pvalue(counts, _expected(table, prompt, 0.8)) < CHI2_FALSE_ALARM


def test_accept_draft_at_temperature_zero_is_argmax():
    logits = np.array([0.1, 3.0, -1.0], dtype=np.float32)
    rng = np.random.default_rng(0)
    assert accept_draft(logits, 1, None, 0.0, 1.0, rng) == (True, 1)
    assert accept_draft(logits, 2, None, 0.0, 1.0, rng) == (False, 1)


# -- where users meet it -------------------------------------------------------------------------
def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_json_counts_target_calls(spec_bundles, capsys):
    path, ids = spec_bundles["rwkv7"], ",".join(map(str, PROMPT))
    code, out, _ = run_cli(capsys, "generate", path, "--tokens", ids, "-n", NEW, "--json")
    plain = json.loads(out)
    assert code == 0 and plain["target_calls"] == NEW and plain["draft"] is None
    code, out, _ = run_cli(capsys, "generate", path, "--tokens", ids, "-n", NEW, "--json", "--draft", "lookup")
    spec = json.loads(out)
    assert code == 0 and spec["ids"] == plain["ids"]
    assert spec["verify_calls"] + spec["main_calls"] == spec["target_calls"] <= NEW
    assert 0 <= spec["accepted"] <= spec["drafted"]
    # a draft bundle (the target itself: every draft holds)
    code, out, _ = run_cli(capsys, "generate", path, "--tokens", ids, "-n", NEW, "--json", "--draft", path)
    drafted = json.loads(out)
    assert code == 0 and drafted["ids"] == plain["ids"] and drafted["accepted"] == drafted["drafted"] > 0
    assert drafted["target_calls"] <= math.ceil(NEW / (K - 1)) + 2


def test_the_export_checks_verify_and_counts_its_ops(spec_bundles):
    from ssmport.bundle import Bundle
    from ssmport.runtime.op_count import count_ops

    bundle = Bundle.open(spec_bundles["rwkv7"])
    counts = count_ops(bundle)
    assert set(counts) == {"main", "verify"} and counts["verify"].ops > counts["main"].ops
    assert bundle.manifest.export["runtime_ops"]["verify"]["ops"] == counts["verify"].ops
    assert 0 <= bundle.manifest.export["verify_vs_main_rel_delta"] <= 1e-4  # the fp32 gate's bound


def test_bad_inputs_are_one_line(spec_bundles, world_bundle, capsys):
    path = spec_bundles["rwkv7"]
    cases = [
        (["generate", world_bundle["bundle"], "--tokens", "1,2", "--draft", "lookup"], "has no verify function"),
        (["generate", path, "--tokens", "1,2", "--draft", "lookup", "--draft-tokens", K + 1], "checks 2 to 4"),
        (["generate", path, "--tokens", "1,2", "--draft-tokens", 2], "applies with --draft only"),
        (["generate", path, "--tokens", "1,2", "--draft", "mtp"], "has no draft head"),
        (["chat", path, "--draft-tokens", 2], "applies with --draft only"),
        (["generate", path, "--tokens", "1,2", "--draft", path.parent / "nope"], "no such bundle"),
        (["generate", path, "--tokens", "1,2", "--draft", spec_bundles["rwkv7-apple"]], "tokenizer differs"),
        (["export", "rwkv7-tiny", "--synthetic", "--verify", "1", "-o", path.parent], "--verify must be between"),
    ]
    for argv, message in cases:
        code, out, err = run_cli(capsys, *argv)
        lines = err.strip().splitlines()
        assert code != 0 and len(lines) == 1 and message in lines[0] and "Traceback" not in err, (argv, err)


def test_chat_with_drafts_says_the_same(spec_bundles, tmp_path, capsys):
    """Two turns (the second reusing the first's state): the same replies with and without
    drafts, and the state after each turn holds exactly the conversation."""
    script = tmp_path / "script.txt"
    script.write_text("hello there\nand again\n")
    argv = ["chat", spec_bundles["rwkv7"], "--script", script, "-n", 24, "--stats"]
    code, plain, _ = run_cli(capsys, *argv)
    assert code == 0
    code, drafted, err = run_cli(capsys, *argv, "--draft", "lookup")
    assert code == 0 and drafted == plain and "target calls" in err


def test_manifest_verify_entry_is_checked(spec_bundles):
    from ssmport.manifest import Manifest

    data = json.loads((spec_bundles["rwkv7"] / "manifest.json").read_text())
    assert Manifest.from_json(data, "m").verify.chunk == K
    data["verify"]["outputs"][0]["shape"] = [1, 1, data["verify"]["outputs"][0]["shape"][-1]]
    with pytest.raises(BundleError, match="logits"):
        Manifest.from_json(data, "m")
    del data["verify"]  # a bundle from before --verify
    assert Manifest.from_json(data, "m").verify is None


def test_verify_takes_at_most_k_tokens(spec_bundles):
    from ssmport.runtime import Runner

    with Runner(spec_bundles["rwkv7"]) as r, pytest.raises(SsmportError, match="1 to 4 tokens"):
        r.verify([1] * (K + 1))


# -- the acceptance figure: rwkv7-pydoc on a prompt that quotes itself ---------------------------
QUOTING = "The json module provides dump() and load(). The json module provides dump() and load(). The json module provides"
PYDOC_NEW, PYDOC_K = 96, 16


@pytest.fixture(scope="module")
def pydoc_runs(bundles, export_fn):
    from ssmport.gate.run import bundle_tokenizer
    from ssmport.runtime import Runner

    path = export_fn("rwkv7-pydoc", bundles, quant="fp32", gate=False, verify=PYDOC_K, prefill_chunk=None,
                     name="spec-pydoc").path  # fmt: skip
    with Runner(path) as r:
        prompt = bundle_tokenizer(r.bundle).encode(QUOTING)
        plain = SpeculativeDecoder(r, None)
        plain_ids = list(plain.generate(prompt, PYDOC_NEW))
        r.reset()
        drafted = SpeculativeDecoder(r, LookupDrafter())
        return plain_ids, plain.stats, list(drafted.generate(prompt, PYDOC_NEW)), drafted.stats


def test_pydoc_lookup_meets_the_issue_figure(pydoc_runs):
    """Issue 31's figure: <= 0.7x plain decoding's target calls, the same ids (measured: 67 of
    96 with K = 16; 68 without the order-0 back-off, 66 with it unconditional,
    docs/speculative.md)."""
    plain_ids, plain, ids, drafted = pydoc_runs
    assert ids == plain_ids and plain.target_calls == PYDOC_NEW
    assert drafted.target_calls <= 0.7 * plain.target_calls


def test_lookup_stops_backing_off_when_its_guesses_miss():
    """The order-0 back-off turns a `main` call into a dearer `verify` call: on text whose new
    tokens never repeat (random output) it is dropped after two misses; while it holds, it
    goes on."""
    def backoffs(next_token):
        drafter, ctx, drafted = LookupDrafter(), [5, 5, 5], 0
        for step in range(20):
            ctx.append(100 + step)  # a token new to the context: no suffix recurs
            draft = drafter.propose(ctx, 4)
            drafted += len(draft.tokens)
            ctx.append(next_token(draft))
        return drafted

    assert backoffs(lambda d: 99) == 2  # every guess missed: two tries, then none
    assert backoffs(lambda d: d.tokens[0] if d.tokens else 5) == 20  # every guess held
