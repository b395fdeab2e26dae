"""Speculative decoding: target calls, wall time, verify's ops and the rollback's cost.

For each bundle (exported with --verify K): plain decoding, prompt lookup and a draft bundle
(`--draft`; here the bundle itself, the acceptance ceiling: every draft holds) and, where the
bundle has one, its own draft head (`--draft mtp`, Qwen3.5's mtp.*) over one prompt,
greedy; the ids must equal plain decoding's. Then the runtime ops of one `main` call and one
full `verify` call (ssmport.runtime.op_count), the fixed-state bytes a per-position form would
output per row, and the time of one mark + rewind (the rollback this form uses).

    PYTHONPATH=. python benchmarks/speculative.py BUNDLE [BUNDLE ...] [--prompt TEXT] [-n 96] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time

QUOTING = "The json module provides dump() and load(). The json module provides dump() and load(). The json module provides"


def drafted_run(runner, drafter, prompt, n):
    from ssmport.runtime.speculative import SpeculativeDecoder

    runner.reset()
    decoder = SpeculativeDecoder(runner, drafter)
    started = time.perf_counter()
    ids = list(decoder.generate(prompt, n))
    total = time.perf_counter() - started
    # the prompt feed is not a generation cost: subtract it, measured alone
    runner.reset()
    started = time.perf_counter()
    runner.feed(prompt)
    feed = time.perf_counter() - started
    return ids, decoder.stats, (total - feed) * 1000 / n


def best_ms(runner, call, repeats: int = 10) -> float:
    """One call's best wall time from zero states, after a warm-up call."""
    call()
    best = float("inf")
    for _ in range(repeats):
        runner.reset()
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 2)


def measure(path: str, text: str, n: int) -> dict:
    from ssmport.drafters import BundleDrafter, LookupDrafter, MTPDrafter
    from ssmport.gate.run import bundle_tokenizer
    from ssmport.runtime import Runner
    from ssmport.runtime.op_count import OpLog, summarize

    log = OpLog()
    with Runner(path) as r, Runner(path) as draft:
        m = r.bundle.manifest
        tokenizer = bundle_tokenizer(r.bundle)
        # a bundle without a tokenizer (synthetic presets): the text's bytes as ids
        prompt = tokenizer.encode(text) if tokenizer else [b % r.vocab_size for b in text.encode()]
        out = {"bundle": m.name, "verify_k": r.verify_rows, "prompt_tokens": len(prompt), "new_tokens": n}
        plain_ids, plain, plain_ms = drafted_run(r, None, prompt, n)
        out["plain"] = plain.to_json() | {"ms_per_token": round(plain_ms, 2)}
        drafters = [("lookup", LookupDrafter()), ("self-draft", BundleDrafter(draft))]
        drafters += [("mtp", MTPDrafter(r))] if r.draft_rows else []
        for name, drafter in drafters:
            ids, stats, ms = drafted_run(r, drafter, prompt, n)
            out[name] = stats.to_json() | {"ms_per_token": round(ms, 2), "same_ids": ids == plain_ids}
        started = time.perf_counter()
        for _ in range(20):
            r.rewind(r.mark())
        out["mark_rewind_ms"] = round((time.perf_counter() - started) * 1000 / 20, 3)
        out["call_ms"] = {"main": best_ms(r, lambda: r.step(1)), f"verify_{r.verify_rows}": best_ms(r, lambda: r.verify([1] * r.verify_rows)),
                          "verify_2": best_ms(r, lambda: r.verify([1, 2]))}  # fmt: skip
        if r.has_prefill:
            out["call_ms"][f"prefill_{r.prefill_chunk}"] = best_ms(r, lambda: r.feed([1] * r.prefill_chunk))
    with Runner(path, profiler=log.profiler()) as r:  # the profiler slows every call: counts only
        m = r.bundle.manifest
        r.step(1)
        out["ops_main"] = summarize(log.calls[-1]).ops
        r.verify([1] * r.verify_rows)
        out["ops_verify"] = summarize(log.calls[-1]).ops
        if r.draft_rows:  # one drafting step of the head (one row)
            r.draft([1], r.hiddens[:1], 0)
            out["ops_draft"] = summarize(log.calls[-1]).ops
        out["fixed_state_bytes"] = m.fixed_state_bytes
        out["kv_bytes_per_token"] = m.kv_bytes_per_token
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("bundles", nargs="+")
    p.add_argument("--prompt", default=QUOTING)
    p.add_argument("-n", type=int, default=96)
    p.add_argument("--json")
    a = p.parse_args()
    rows = [measure(b, a.prompt, a.n) for b in a.bundles]
    for row in rows:
        print(json.dumps(row))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
