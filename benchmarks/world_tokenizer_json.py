"""The World tokenizer.json (ssmport.tokenizers.world_json) against WorldTokenizer, on >= 10 MB.

Run from the repository root (the check takes a minute; run it alone):

    flock /tmp/ssmport-heavy.lock .venv/bin/python benchmarks/world_tokenizer_json.py
    # also through tokenizers.js (npm install @huggingface/tokenizers@0.2.0 in DIR):
    ... benchmarks/world_tokenizer_json.py --tokenizers-js DIR/node_modules/@huggingface/tokenizers

The text is built here from what installs with the venv, deterministically: the Python
standard library's sources (code, docstrings, comments), concatenations of random World
vocab tokens (every script the vocab covers, and its token boundaries), random code points
from all planes plus emoji sequences (ZWJ families, flags, skin tones, keycaps), and random
bytes (mostly invalid UTF-8; through the raw-bytes variant, since `tokenizers` takes only
text). Each part is checked id-for-id and decode-for-decode, as one input and line by line.
MB = 10**6 bytes of UTF-8 input; times are the best of --repeat runs. Exit status 1 on any
mismatch.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from tokenizers import Tokenizer  # noqa: E402

from ssmport.tokenizers import BUNDLED_WORLD_VOCAB, WorldTokenizer  # noqa: E402
from ssmport.tokenizers.world_json import byte_level_text, raw_bytes_tokenizer_json, world_tokenizer_json  # noqa: E402

_EMOJI = ["👩\u200d👩\u200d👧\u200d👦", "👨🏽\u200d💻", "🇯🇵", "🇺🇸", "👍🏿", "1\ufe0f\u20e3", "❤\ufe0f", "🏳\ufe0f\u200d🌈", "😀", "🎉"]


def stdlib_text(limit: int) -> str:
    parts, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        parts.append(text)
        size += len(text.encode("utf-8"))
        if size >= limit:
            break
    return "".join(parts)


def token_mix_text(world: WorldTokenizer, rng: random.Random, limit: int) -> str:
    tokens = [t for t in world.id_to_bytes.values()]
    out, size = bytearray(), 0
    while size < limit:
        out += rng.choice(tokens)
        size = len(out)
    return out.decode("utf-8", errors="ignore")  # the valid text these tokens make, boundaries included


def unicode_text(rng: random.Random, limit: int) -> str:
    chars, size = [], 0
    while size < limit:
        if rng.random() < 0.1:
            c = rng.choice(_EMOJI)
        else:
            cp = rng.randint(0, rng.choice((0x7F, 0x7FF, 0xFFFF, 0x10FFFF)))
            c = chr(cp if not 0xD800 <= cp <= 0xDFFF else 0xFFFD)
        chars.append(c)
        size += len(c.encode("utf-8"))
    return "".join(chars)


def best_time(fn, repeat: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=10.5, help="total input size in MB (default 10.5)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--tokenizers-js", type=Path, help="a tokenizers.js package dir: check it too (needs node)")
    args = parser.parse_args()

    world = WorldTokenizer.from_file(BUNDLED_WORLD_VOCAB).warm_up()
    t0 = time.perf_counter()
    json_text = world_tokenizer_json(world)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    hf = Tokenizer.from_str(json_text)
    load_s = time.perf_counter() - t0
    hf_bytes = Tokenizer.from_str(raw_bytes_tokenizer_json(json_text))
    print(f"tokenizer.json: {len(json_text.encode()) / 1e6:.2f} MB, built in {build_s:.1f} s, loads in {load_s:.2f} s")

    rng = random.Random(20230424)
    total = int(args.mb * 1e6)
    texts = {
        "stdlib source": stdlib_text(int(total * 0.45)),
        "vocab token mix": token_mix_text(world, rng, int(total * 0.2)),
        "unicode + emoji": unicode_text(rng, int(total * 0.15)),
    }
    raw = rng.randbytes(int(total * 0.2))

    failures, checked, js_inputs = 0, 0, {}
    print(f"{'part':<18}{'MB':>7}{'tokens':>11}{'ids':>6}{'decode':>8}{'lines':>7}{'World MB/s':>12}{'HF MB/s':>9}")
    for name, text in texts.items():
        data = text.encode("utf-8")
        mb = len(data) / 1e6
        t_w, ids = best_time(lambda: world.encode(data), args.repeat)
        t_h, got = best_time(lambda: hf.encode(text, add_special_tokens=False).ids, args.repeat)
        same = got == ids
        decoded = hf.decode(ids) == text
        lines = text.splitlines(keepends=True)
        per_line = [e.ids for e in hf.encode_batch(lines, add_special_tokens=False)] == [world.encode(x) for x in lines]
        failures += (not same) + (not decoded) + (not per_line)
        checked += len(data)
        js_inputs[name] = (text, ids)
        print(f"{name:<18}{mb:>7.2f}{len(ids):>11}{'ok' if same else 'FAIL':>6}{'ok' if decoded else 'FAIL':>8}"
              f"{'ok' if per_line else 'FAIL':>7}{mb / t_w:>12.2f}{mb / t_h:>9.2f}")
    mb = len(raw) / 1e6
    t_w, ids = best_time(lambda: world.encode(raw), args.repeat)
    spelled = byte_level_text(raw)
    t_h, got = best_time(lambda: hf_bytes.encode(spelled, add_special_tokens=False).ids, args.repeat)
    same, decoded = got == ids, hf_bytes.decode(ids) == world.decode_text(ids)
    failures += (not same) + (not decoded)
    checked += len(raw)
    print(f"{'random bytes':<18}{mb:>7.2f}{len(ids):>11}{'ok' if same else 'FAIL':>6}{'ok' if decoded else 'FAIL':>8}"
          f"{'-':>7}{mb / t_w:>12.2f}{mb / t_h:>9.2f}")
    print(f"checked {checked / 1e6:.2f} MB, {failures} mismatches")

    if args.tokenizers_js:
        failures += check_js(args.tokenizers_js, json_text, js_inputs)
    return 1 if failures else 0


_JS = """
import { Tokenizer } from "%s";
import fs from "fs";
const [tokFile, inFile, outFile] = process.argv.slice(2);
const tok = new Tokenizer(JSON.parse(fs.readFileSync(tokFile, "utf8")), { clean_up_tokenization_spaces: false });
const inputs = JSON.parse(fs.readFileSync(inFile, "utf8"));
const out = {};
for (const [name, text] of Object.entries(inputs)) {
  const t0 = Date.now();
  const ids = tok.encode(text, { add_special_tokens: false }).ids;
  out[name] = { ids, ms: Date.now() - t0, decoded: ids.length ? tok.decode(ids) === text : text === "" };
}
fs.writeFileSync(outFile, JSON.stringify(out));
"""


def check_js(package: Path, json_text: str, inputs: dict[str, tuple[str, list[int]]]) -> int:
    entry = package.resolve() / "dist" / "tokenizers.mjs"
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "tokenizer.json").write_text(json_text, encoding="utf-8")
        (d / "in.json").write_text(json.dumps({k: v[0] for k, v in inputs.items()}), encoding="utf-8")
        (d / "run.mjs").write_text(_JS % entry.as_uri(), encoding="utf-8")
        subprocess.run(["node", d / "run.mjs", d / "tokenizer.json", d / "in.json", d / "out.json"], check=True)
        out = json.loads((d / "out.json").read_text(encoding="utf-8"))
    failures = 0
    for name, (text, ids) in inputs.items():
        r = out[name]
        ok = r["ids"] == ids
        failures += (not ok) + (not r["decoded"])
        mb = len(text.encode("utf-8")) / 1e6
        print(f"tokenizers.js {name:<18} ids {'ok' if ok else 'FAIL'}, decode {'ok' if r['decoded'] else 'FAIL'}, "
              f"{mb / max(r['ms'], 1) * 1e3:.2f} MB/s")
    return failures


if __name__ == "__main__":
    sys.exit(main())
