"""Turn-2 time to first token over a long history: state reuse vs re-reading the transcript.

Turn 1 is a user message of ~--history tokens plus a short reply; turn 2 a short message.
With reuse (ssmport.runtime.chat.ChatSession) turn 2 feeds only its own tokens to the state the
session holds; without, a fresh state is fed the whole transcript (what chat apps do with
recurrent models today). Both give the logits of turn 2's first reply token, which must be
identical. Run on an exported bundle (rwkv7-0.1b synthetic fp32 by default):

    flock /tmp/ssmport-heavy.lock python benchmarks/chat_ttft.py --json benchmarks/results/chat_ttft_rwkv7-0.1b.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from ssmport.bundle import Bundle
from ssmport.exporter.pipeline import export
from ssmport.gate.run import bundle_tokenizer
from ssmport.runtime import Runner
from ssmport.runtime.chat import ChatSession, chat_template

WORDS = ("the model reads every token once and keeps a state of fixed size so the cost of a "
         "long conversation is paid when it is written and never again when it is continued").split()  # fmt: skip


def long_message(tokenizer, n_tokens: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    words: list[str] = []
    while len(tokenizer.encode(" ".join(words))) < n_tokens:
        words += list(rng.choice(WORDS, 64))
    while len(tokenizer.encode(" ".join(words))) > n_tokens:
        words.pop()
    return " ".join(words)


def measure(bundle: Bundle, history: int, reply_tokens: int, seed: int) -> dict:
    tokenizer = bundle_tokenizer(bundle)
    template = chat_template(bundle, tokenizer)
    with Runner(bundle) as runner:
        has_prefill = runner.has_prefill  # (read while open: close() drops the functions)
        session = ChatSession(runner, tokenizer, template)
        start = time.perf_counter()
        reply = "".join(session.send(long_message(tokenizer, history, seed), max_tokens=reply_tokens))
        turn1_s = time.perf_counter() - start
        history_tokens = len(session.transcript)
        prompt = session.transcript + tokenizer.encode(template.user_turn("And what follows from that?", first=False))

        start = time.perf_counter()
        warm = session.prefill_to(prompt)
        warm_first = int(np.argmax(warm))
        warm_s = time.perf_counter() - start
        fed_warm = session.last.fed_tokens

        runner.reset()
        start = time.perf_counter()
        cold = runner.feed(prompt)
        cold_first = int(np.argmax(cold))
        cold_s = time.perf_counter() - start
    return {
        "bundle": bundle.manifest.name, "recipe": bundle.manifest.recipe.name,
        "synthetic_weights": bundle.manifest.synthetic_weights,
        "history_tokens": history_tokens, "turn1_reply": reply,
        "turn2_prompt_tokens": len(prompt), "turn2_fed_with_reuse": fed_warm,
        "turn1_seconds": round(turn1_s, 2),
        "ttft_reuse_s": round(warm_s, 4), "ttft_no_reuse_s": round(cold_s, 3),
        "speedup": round(cold_s / warm_s, 1),
        "first_token_equal": warm_first == cold_first,
        "logits_max_abs_diff": float(np.abs(warm - cold).max()),
        "prefill_function": has_prefill,
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", help="an existing bundle (default: export rwkv7-0.1b --synthetic fp32)")
    p.add_argument("--history", type=int, default=2000, help="turn-1 message length in tokens (default 2000)")
    p.add_argument("--reply-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = a.bundle or export("rwkv7-0.1b", tmp, synthetic=True, quant="fp32", gate=False, progress=False).path
        r = measure(Bundle.open(path), a.history, a.reply_tokens, a.seed)
    print(json.dumps(r, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=2) + "\n")


if __name__ == "__main__":
    main()
