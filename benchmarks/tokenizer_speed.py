"""Encode/decode throughput of ssmport's WorldTokenizer vs the reference tokenizers.

Run from the repository root:

    /work/venv/bin/python benchmarks/tokenizer_speed.py
    # optionally with the Rust wheels installed in another venv of the same Python:
    /work/venv/bin/python benchmarks/tokenizer_speed.py --extra-site /tmp/rwkvtok-venv/lib/python3.11/site-packages

Compared, in one run and on the same deterministic ~1 MB mixed-script text:
  * ssmport      -- ssmport.tokenizers.WorldTokenizer (pure Python + stdlib re)
  * reference    -- rwkv.rwkv_tokenizer.TRIE_TOKENIZER from the `rwkv` package (pure Python)
  * rwkv-tokenizer / pyrwkv-tokenizer -- Rust wheels, if importable (skipped otherwise)
Plus a random-bytes corpus (mostly invalid UTF-8, 1 byte per token: the worst
case) for the two implementations that take bytes.

MB = 10**6 bytes of UTF-8 input (for decode: of output).  Each timing is the
best of --repeat runs with the garbage collector off.  Every implementation's
ids are checked against the reference; the exit status is 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.resources
import platform
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from ssmport.tokenizers import WorldTokenizer  # noqa: E402

_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an they "
    "you were her she there been one all we their has would when if so no will more can who its about into than "
    "model token state recurrent linear attention decode export bundle weights layer matrix vector kernel cache "
    "tokenizer streaming parity gate quantize Apple RWKV Mamba DeltaNet Python benchmark throughput latency"
).split()
_HANZI = (  # common characters
    "的一是不了在人有我他这个们中来上大为和国地到以说时要就出会可也你对生能而子那得于着下自之年过发后作里用道行所然家种事成方多经么去法学如都同现当没动面起看定天分还进好小部其些主样理心她本前开但因只从想实"
    "日军者意无力它与长把机十民第公此已工使情明性知全三又关点正业外将两高间由问很最重并物手应战向头文体政美相见被利什二等产或新己制身果加西斯月话合回特代内信表化老给世位次度门任常先海通教儿原东声提立及比员"
)
_CODE = (
    "def {f}({a}, {b}=None):\n    \"\"\"{w} {w} {w}.\"\"\"\n    if {b} is None:\n        {b} = []\n"
    "    for i in range({n}):\n        {b}.append({a}[i] * {n})\n    return {b}\n\n",
    "for (int {a} = 0; {a} < {n}; ++{a}) {{\n\t{b}[{a}] += {f}({a}) >> 2;\n}}\n",
    '{{"{w}": [{n}, {n}, {n}], "{a}": "{w} {w}", "ok": true}}\n',
    "<div class=\"{w}\">{w} &amp; {w}</div>\n",
)
_SNIPPETS = (
    "Привет, мир! Это тестовый текст для токенизатора. ",
    "مرحبا بالعالم، هذا نص تجريبي. ",
    "日本語のテキストです。ひらがなとカタカナ。",
    "한국어 텍스트입니다. ",
    "👩\u200d👩\u200d👧\u200d👦 🇯🇵 👍🏽 ❤\ufe0f ",
    "Tiếng Việt có dấu. e\u0301 a\u0308 ",
    "    \n\n\t\t  \n",
)


def mixed_text(size: int, seed: int = 0) -> str:
    """Deterministic mixed-script text of about ``size`` UTF-8 bytes."""
    rng = random.Random(seed)
    parts: list[str] = []
    total = 0
    while total < size:
        kind = rng.random()
        if kind < 0.45:  # English-like prose
            words = [rng.choice(_WORDS) for _ in range(rng.randint(20, 120))]
            words[0] = words[0].capitalize()
            piece = " ".join(words) + ". "
        elif kind < 0.65:  # Chinese
            piece = "".join(rng.choice(_HANZI) for _ in range(rng.randint(20, 120))) + "。"
        elif kind < 0.85:  # code
            fmt = rng.choice(_CODE)
            piece = fmt.format(
                f=rng.choice(_WORDS) + "_fn", a="x" + str(rng.randint(0, 9)), b="acc", n=rng.randint(0, 4096),
                w=rng.choice(_WORDS),
            )
        else:
            piece = rng.choice(_SNIPPETS) * rng.randint(1, 4)
        parts.append(piece)
        total += len(piece.encode("utf-8"))
    return "".join(parts)


@dataclass
class Impl:
    name: str
    load: Callable[[], Any]
    encode: Callable[[Any, Any], list[int]]  # (tokenizer, str or bytes) -> ids
    decode: Callable[[Any, list[int]], Any]
    takes_bytes: bool


def implementations(vocab: Path) -> list[Impl]:
    from rwkv.rwkv_tokenizer import TRIE_TOKENIZER

    impls = [
        Impl("ssmport", lambda: WorldTokenizer.from_file(vocab).warm_up(), lambda t, x: t.encode(x),
             lambda t, ids: t.decode(ids), True),
        Impl("reference (rwkv 0.8.32)", lambda: TRIE_TOKENIZER(str(vocab)),
             lambda t, x: t.encodeBytes(x) if isinstance(x, bytes) else t.encode(x),
             lambda t, ids: t.decodeBytes(ids), True),
    ]
    for module_name, label in (("rwkv_tokenizer", "rwkv-tokenizer"), ("pyrwkv_tokenizer", "pyrwkv-tokenizer")):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            print(f"[skip] {label}: not importable (see --extra-site)")
            continue
        version = getattr(module, "__version__", None) or _dist_version(label)
        impls.append(Impl(f"{label} {version} (Rust)", lambda m=module: m.WorldTokenizer(str(vocab)),
                          lambda t, x: t.encode(x), lambda t, ids: t.decode(ids), False))
    return impls


def _dist_version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def best_time(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            result = fn()
            best = min(best, time.perf_counter() - t0)
        finally:
            gc.enable()
    return best, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=1.0, help="mixed text corpus size (default 1.0)")
    parser.add_argument("--random-kb", type=int, default=256, help="random-bytes corpus size (default 256)")
    parser.add_argument("--repeat", type=int, default=3, help="timing repeats, best is reported (default 3)")
    parser.add_argument("--vocab", type=Path, help="vocab file (default: the one shipped in the rwkv package)")
    parser.add_argument("--extra-site", action="append", default=[], metavar="DIR",
                        help="extra site-packages dir to import the Rust wheels from (same Python version)")
    args = parser.parse_args(argv)
    for site in args.extra_site:
        sys.path.append(site)
    vocab = args.vocab or Path(str(importlib.resources.files("rwkv") / "rwkv_vocab_v20230424.txt"))

    text = mixed_text(int(args.size_mb * 1e6))
    text_bytes = text.encode("utf-8")
    random_bytes = random.Random(1).randbytes(args.random_kb * 1000)
    print(f"python {platform.python_version()} on {platform.machine()}, {platform.processor() or platform.system()}")
    print(f"vocab: {vocab}")
    print(f"mixed text: {len(text_bytes):,} bytes; random bytes: {len(random_bytes):,} bytes; best of {args.repeat}\n")

    rows = []
    ok = True
    for impl in implementations(vocab):
        load_s, tok = best_time(impl.load, 1)
        enc_s, ids = best_time(lambda: impl.encode(tok, text), args.repeat)
        dec_s, out = best_time(lambda: impl.decode(tok, ids), args.repeat)
        decoded = out if isinstance(out, bytes) else out.encode("utf-8")
        row = {"name": impl.name, "load": load_s, "tokens": len(ids),
               "enc": len(text_bytes) / enc_s / 1e6, "dec": len(decoded) / dec_s / 1e6,
               "rand_enc": None}
        if impl.takes_bytes:
            rand_s, rand_ids = best_time(lambda: impl.encode(tok, random_bytes), args.repeat)
            row["rand_enc"] = len(random_bytes) / rand_s / 1e6
            row["rand_ids"] = rand_ids
        row["ids"] = ids
        row["roundtrip"] = decoded == text_bytes
        rows.append(row)
        del tok
        gc.collect()

    ref = next(r for r in rows if r["name"].startswith("reference"))
    print(f"{'implementation':<30} {'load s':>7} {'encode MB/s':>12} {'decode MB/s':>12} "
          f"{'rand-bytes enc MB/s':>20} {'tokens':>8}  ids == reference")
    for r in rows:
        same = r["ids"] == ref["ids"] and ("rand_ids" not in r or r["rand_ids"] == ref["rand_ids"])
        ok &= same and r["roundtrip"]
        rand = f"{r['rand_enc']:.2f}" if r["rand_enc"] is not None else "n/a"
        print(f"{r['name']:<30} {r['load']:>7.2f} {r['enc']:>12.2f} {r['dec']:>12.2f} {rand:>20} {r['tokens']:>8}  "
              f"{'yes' if same else 'NO'}{'' if r['roundtrip'] else ' (decode mismatch!)'}")
    ours = next(r for r in rows if r["name"] == "ssmport")
    print(f"\nssmport / reference: encode x{ours['enc'] / ref['enc']:.2f}, decode x{ours['dec'] / ref['dec']:.2f}, "
          f"random-bytes encode x{ours['rand_enc'] / ref['rand_enc']:.2f}, load x{ref['load'] / ours['load']:.2f} faster")
    if not ok:
        print("ERROR: token ids or decoded text differ from the reference", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
