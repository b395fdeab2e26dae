"""State snapshots and multi-turn reuse: reuse must be exact, not approximately right."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from ssmport.bundle import Bundle
from ssmport.cli.main import main
from ssmport.errors import SsmportError
from ssmport.runtime import Runner
from ssmport.runtime.chat import RWKV_WORLD_CHAT, ChatSession, ChatTemplate
from ssmport.runtime.snapshot import StateSnapshot
from ssmport.runtime.snapshot_cache import SnapshotCache
from ssmport.tokenizers import WorldTokenizer

VOCAB = 320  # the test checkpoints' vocabulary


@pytest.fixture(scope="module")
def tokenizer() -> WorldTokenizer:
    """Single bytes 1..255 and multi-byte tokens up to id 319 (the 320-row embedding)."""
    table = {i: bytes([i]) for i in range(1, 256)}
    for i, piece in enumerate([b"\n\n", b"User", b"Assistant", b": ", b" the", b"a\n\nb"], start=256):
        table[i] = piece
    for i in range(262, VOCAB):
        table[i] = b"w%d " % i
    return WorldTokenizer(table)


@pytest.fixture(scope="module")
def runner(pth_fp32_bundle):
    with Runner(pth_fp32_bundle.path) as r:
        yield r


def test_restore_is_exact_and_o1(runner):
    runner.reset()
    runner.feed([5, 6, 7])
    snap = runner.snapshot()
    after = runner.feed([8, 9])
    assert snap.tokens == (5, 6, 7) and runner.tokens == [5, 6, 7, 8, 9]
    runner.restore(snap)
    assert runner.tokens == [5, 6, 7]
    assert np.array_equal(runner.feed([8, 9]), after)
    # its size is the state's, not the history's
    assert snap.nbytes == sum(a.nbytes for a in snap.states.values()) + 4 * 3


def test_snapshot_file_round_trip(runner, pth_fp32_bundle, tmp_path):
    runner.reset()
    runner.feed([11, 12, 13])
    path = runner.snapshot().save(tmp_path / "s.safetensors")
    expect = runner.feed([14])
    from safetensors import safe_open

    with safe_open(str(path), "np") as f:
        header = json.loads(f.metadata()["ssmport"])
    assert header["bundle_id"] == pth_fp32_bundle.manifest.bundle_id
    assert header["architecture"] == "rwkv7" and header["token_count"] == 3
    with Runner(pth_fp32_bundle.path) as fresh:
        fresh.restore(StateSnapshot.load(path))
        assert fresh.tokens == [11, 12, 13]
        assert np.array_equal(fresh.feed([14]), expect)


def test_snapshot_from_another_bundle_is_refused(runner, pth_fp32_bundle, tmp_path):
    other = shutil.copytree(pth_fp32_bundle.path, tmp_path / "other")
    b = Bundle.open(other)
    b.manifest.bundle_id = "0" * 32
    b.save_manifest()
    runner.reset()
    runner.feed([3])
    with Runner(other) as r, pytest.raises(SsmportError, match="taken from another bundle"):
        r.restore(runner.snapshot())


@pytest.mark.parametrize("change", ["dtype", "shape", "name"])
def test_wrong_state_dtype_or_shape_is_refused(runner, change):
    snap = runner.snapshot()
    states = dict(snap.states)
    if change == "dtype":
        states["recState"] = states["recState"].astype(np.float16)
    elif change == "shape":
        states["recState"] = states["recState"][:1]
    else:
        states["other"] = states.pop("recState")
    bad = StateSnapshot(snap.bundle_id, snap.architecture, states, snap.tokens)
    with pytest.raises(SsmportError, match="the bundle's are"):
        runner.restore(bad)


def test_corrupt_snapshot_file_is_one_clear_error(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(SsmportError, match="not a valid ssmport state snapshot"):
        StateSnapshot.load(bad)


@pytest.mark.parametrize("prefill", [False, True])
def test_turn_two_with_reuse_equals_a_cold_run(pth_fp32_bundle, tokenizer, prefill):
    """Logits and reply of turn 2, with the state reused, equal a cold run over the full
    transcript; and a rewind (a different turn 2) restores the turn-1 snapshot.

    Through `main` alone both runs do the same operations: bit-identical. Through prefill the
    chunk boundaries differ between the two runs (summation order), so: within prefill's
    1e-4 exactness bound, and the same reply."""
    same = np.array_equal if not prefill else (lambda a, b: np.abs(a - b).max() <= 1e-4)
    runner = Runner(pth_fp32_bundle.path, prefill=prefill)
    session = ChatSession(runner, tokenizer, RWKV_WORLD_CHAT)
    runner.reset()
    reply1 = "".join(session.send("Hello there", max_tokens=6))
    history = list(session.transcript)
    assert runner.tokens == history and tokenizer.decode_text(history).endswith(reply1)

    turn2 = history + tokenizer.encode(RWKV_WORLD_CHAT.user_turn("What next?", first=False))
    warm = session.prefill_to(turn2)
    assert session.last.reused_tokens == len(history) and not session.last.restored
    assert session.last.fed_tokens == len(turn2) - len(history)
    with runner, Runner(pth_fp32_bundle.path, prefill=prefill) as cold_runner:
        cold = cold_runner.feed(turn2)
        assert same(warm, cold)
        warm_reply = "".join(session.generate(turn2, max_tokens=6))
        cold_session = ChatSession(cold_runner, tokenizer, RWKV_WORLD_CHAT)
        cold_runner.reset()
        assert "".join(cold_session.generate(turn2, max_tokens=6)) == warm_reply
        assert cold_session.transcript == session.transcript

        other = history + tokenizer.encode(RWKV_WORLD_CHAT.user_turn("Something else", first=False))
        rewound = session.prefill_to(other)
        assert session.last.restored and session.last.reused_tokens == len(history)
        cold_runner.reset()
        assert same(rewound, cold_runner.feed(other))


class ScriptedRunner:
    """A stand-in model that emits a fixed token script; its 'state' is its token list."""

    def __init__(self, script: list[int], vocab: int = VOCAB):
        self.script, self.vocab, self.tokens = script, vocab, []
        self.prompt_len = 0

    def _logits(self) -> np.ndarray:
        out = np.zeros(self.vocab, np.float32)
        i = len(self.tokens) - self.prompt_len
        out[self.script[i] if i < len(self.script) else 1] = 1.0
        return out

    def reset(self):
        self.tokens = []

    def step(self, t):
        self.tokens.append(t)
        return self._logits()

    def feed(self, ts):  # like Runner.feed: the logits after the last token
        assert ts, "feed needs at least one token"
        return [self.step(t) for t in ts][-1]

    def snapshot(self):
        return StateSnapshot("id", "scripted", {}, tuple(self.tokens))

    def restore(self, snap):
        self.tokens = list(snap.tokens)


TEMPLATE = ChatTemplate(first_user="{message}", next_user="{message}", stop_strings=("\n\n",), eos_ids=(0,))


@pytest.mark.parametrize(
    "script, shown, state_text",
    [
        ([ord("H"), ord("i"), 0, ord("x")], "Hi", "Hi"),  # EOS: never fed
        ([ord("H"), ord("i"), 256, ord("x")], "Hi", "Hi"),  # "\n\n" as one token
        ([ord("H"), ord("i"), 10, 10, ord("x")], "Hi", "Hi"),  # split "\n" "\n": rolled back
        ([ord("H"), 10, ord("i"), 10, 10], "H\ni", "H\ni"),  # a lone "\n" is text
        ([ord("H"), 261, ord("x")], "Ha", "Ha"),  # "a\n\nb" straddles: its visible "a" is kept
        ([ord("H"), ord("i"), ord("!")], "Hi!", "Hi!"),  # max tokens
    ],
)
def test_reply_stops_exactly_and_state_holds_what_was_shown(tokenizer, script, shown, state_text):
    runner = ScriptedRunner(script)
    prompt = tokenizer.encode("Q:")
    runner.prompt_len = len(prompt)
    session = ChatSession(runner, tokenizer, TEMPLATE)
    assert "".join(session.generate(prompt, max_tokens=3 if shown == "Hi!" else 10)) == shown
    assert runner.tokens == session.transcript
    assert tokenizer.decode_text(runner.tokens[len(prompt) :]) == state_text


def test_snapshot_cache_is_bounded_and_finds_the_longest_prefix():
    def snap(tokens, nbytes=100):
        return StateSnapshot("id", "a", {"s": np.zeros(nbytes - 4 * len(tokens), np.uint8)}, tuple(tokens))

    cache = SnapshotCache(max_count=3, max_bytes=1000)
    for t in ([1], [1, 2], [1, 2, 3], [1, 2, 3, 4]):
        cache.put(snap(t))
    assert len(cache) == 3  # [1] evicted (least recently used)
    assert cache.longest_proper_prefix([1, 2, 3, 4]).tokens == (1, 2, 3)
    assert cache.longest_proper_prefix([1, 2, 9]).tokens == (1, 2)
    assert cache.longest_proper_prefix([1]) is None
    cache.put(snap([7], nbytes=900))  # over the byte cap together: the oldest go
    assert cache.nbytes <= 1000 and cache.longest_proper_prefix([7, 1]).tokens == (7,)
    cache.put(snap([8], nbytes=2000))  # bigger than the whole budget: not kept
    assert cache.longest_proper_prefix([8, 1]) is None


def test_chat_cli_script(multi_function_bundle, tmp_path, capsys):
    script = tmp_path / "s.txt"
    script.write_text("Hello\nAnd then?\n/retry\n/undo\n")
    code = main(["chat", str(multi_function_bundle), "--script", str(script), "-n", "4", "--stats"])
    out, err = capsys.readouterr()
    assert code == 0, err
    echoed = [line for line in out.splitlines() if line in ("> Hello", "> And then?", "> /retry", "> /undo")]
    assert len(echoed) == 4
    stats = [line for line in err.splitlines() if line.startswith("[prompt")]
    assert len(stats) == 3
    assert " 0 reused" in stats[0] and "from a snapshot" in stats[2]


def test_chat_cli_needs_a_tokenizer(pth_fp32_bundle, tmp_path, capsys):
    script = tmp_path / "s.txt"
    script.write_text("Hello\n")
    code = main(["chat", str(pth_fp32_bundle.path), "--script", str(script)])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "has no tokenizer" in err
