"""Qwen3.5 in one run: export (fp32 and int8keepproj), load, decode, prefill and multi-turn
reuse on the Core AI runtime, and transformers' own torch path for the same weights.

    flock /tmp/ssmport-heavy.lock python benchmarks/qwen35_bench.py --json benchmarks/results/qwen35_0.8b.json

For `--preset` (default qwen3.5-0.8b) with synthetic weights:
- `ssmport export --synthetic` for fp32 and int8keepproj, each in its own process (so the
  manifest's peak RSS is that export's): wall and export seconds, peak RSS, asset bytes vs the
  plan's analytic total, the export gate, KV bytes per token at the default context;
- on the fp32 bundle: `ssmport.bench.bench_bundle` (load first / cached, decode ms/token),
  prefill tokens/s vs the M=1 loop at 64 and 512 tokens (benchmarks/prefill_speed.py's measure);
- transformers' `Qwen3_5ForCausalLM` on the same synthetic weights (its pure-torch path; the
  kernel guard of tests/hybrid_files.py), decode ms/token through its cache at 1 thread and at
  torch's default, and its logits against the bundle's over the same tokens;
- multi-turn (benchmarks/chat_ttft.py's measure): turn-2 time to first token with the state
  reused vs a fresh state fed the whole transcript; the bundle carries a small trained BPE
  tokenizer with a ChatML template (tests/hybrid_files.write_tokenizer), as synthetic presets
  have none. Plus: the reused state vs replaying the history with the very same calls
  (bit-identical logits expected).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]

import chat_ttft  # noqa: E402
import hybrid_files  # noqa: E402
import prefill_speed  # noqa: E402

from ssmport.bench import bench_bundle, bench_tokens, step_times_ms  # noqa: E402
from ssmport.bundle import Bundle, dir_bytes  # noqa: E402
from ssmport.runtime import Runner, lowered_path  # noqa: E402
from ssmport.loader.resolve import load_model  # noqa: E402


def export_in_process_of_its_own(preset: str, recipe: str, out: Path, vocab: Path, context: int | None,
                                 gate_steps: int = 8) -> dict:
    cmd = [sys.executable, "-m", "ssmport.cli.main", "export", preset, "--synthetic", "--quant", recipe,
           "--vocab", str(vocab), "-o", str(out), "-q", "--gate-steps", str(gate_steps),
           "--profile-memory"] + (  # a manifest records the export's timings only when profiled
               ["--context", str(context)] if context else [])  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):  # 1: written, but its gate failed (recorded below)
        raise SystemExit(f"export failed ({proc.returncode}): {proc.stderr[-2000:]}")
    m = Bundle.open(out / f"{preset}-{recipe}").manifest
    plan = m.plan["summary"]["total"]
    return {
        "recipe": recipe, "wall_seconds": round(wall, 1), "export_seconds": m.export["seconds"],
        "stage_seconds": m.export["stage_seconds"], "peak_rss_mb": m.export["peak_rss_mb"],
        "asset_bytes": m.asset.bytes, "plan_bytes": plan, "asset_vs_plan": m.asset.bytes / plan - 1,
        "plan_by_role": m.plan["summary"]["by_role"], "gate": m.gate.__dict__ if m.gate else None,
        "context": m.context, "kv_bytes_per_token": m.kv_bytes_per_token,
        "kv_bytes_at_context": m.kv_bytes_per_token * m.context, "fixed_state_bytes": m.fixed_state_bytes,
        "stdout": proc.stdout.strip().splitlines(),
    }  # fmt: skip


def transformers_model(model):
    """transformers' Qwen3_5ForCausalLM holding `model`'s (synthetic) weights, fp32, eval."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    hybrid_files.assert_torch_paths()
    c = model.config
    text = {"vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_layers, "layer_types": list(c.layer_types),
            "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
            "head_dim": c.head_dim, "linear_num_key_heads": c.linear_num_key_heads,
            "linear_num_value_heads": c.linear_num_value_heads, "linear_key_head_dim": c.linear_key_head_dim,
            "linear_value_head_dim": c.linear_value_head_dim, "linear_conv_kernel_dim": c.linear_conv_kernel_dim,
            "rms_norm_eps": c.rms_norm_eps, "tie_word_embeddings": False, "max_position_embeddings": c.max_position_embeddings,
            "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta,
                                "partial_rotary_factor": c.rotary_dim / c.head_dim}}  # fmt: skip
    with torch.device("meta"):
        hf = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**text))
    state = {name: model.weights[name] for name in model.weights}
    hf.load_state_dict(state, strict=True, assign=True)
    hf.model.rotary_emb.__init__(hf.config)  # its inv_freq buffers were created on meta
    return hf.eval()


class TransformersStepper:
    """reset / step(token) -> logits over transformers' own cache (what step_times_ms drives)."""

    def __init__(self, hf):
        self.hf, self.cache = hf, None

    def reset(self):
        self.cache = None

    @torch.no_grad()
    def step(self, token: int) -> np.ndarray:
        out = self.hf(torch.tensor([[token]]), past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
        return out.logits[0, -1].float().numpy()


def reuse_vs_same_call_replay(bundle: Bundle, history: int) -> dict:
    """Turn 2 with the state the session kept vs a fresh state driven through the very same
    calls (turn 1's prompt feed, its reply one step at a time, turn 2's feed): a snapshot and a
    held state must change nothing, so the logits are expected bit-identical."""
    from ssmport.gate.run import bundle_tokenizer
    from ssmport.runtime.chat import ChatSession, chat_template

    tok = bundle_tokenizer(bundle)
    template = chat_template(bundle, tok)
    with Runner(bundle) as runner:
        session = ChatSession(runner, tok, template)
        "".join(session.send(chat_ttft.long_message(tok, history, seed=1), max_tokens=16))
        prompt1 = session.last.prompt_tokens
        transcript = list(session.transcript)
        new = tok.encode(template.user_turn("And what follows from that?", first=False))
        warm = session.prefill_to(transcript + new)
        runner.reset()
        runner.feed(transcript[:prompt1])
        runner.step_each(transcript[prompt1:])
        replay = runner.feed(new)
    return {"history_tokens": len(transcript), "turn2_tokens": len(new), "bit_identical": bool(np.array_equal(warm, replay)),
            "max_abs_diff": float(np.abs(warm - replay).max())}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="qwen3.5-0.8b")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--prompts", nargs="+", type=int, default=[64, 512])
    p.add_argument("--history", type=int, default=2000, help="turn-1 message length for the multi-turn part")
    p.add_argument("--context", type=int, help="--context of the exports (default: the preset's)")
    p.add_argument("--recipes", nargs="+", default=["fp32", "int8keepproj"], help="the exports (fp32 is always benched)")
    p.add_argument("--gate-steps", type=int, default=8, help="the exports' --gate-steps (int8 calls are slow on this "
                   "runtime: it dequantizes every weight on every call)")
    p.add_argument("--keep", help="keep the bundles in this directory (default: a temp dir, removed)")
    p.add_argument("--json")
    a = p.parse_args()
    result: dict = {"preset": a.preset, "machine": f"{platform.machine()} {platform.system()}, {os.cpu_count()} cores, "
                    "shared with other jobs", "torch": torch.__version__}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="qwen35-bench-") as tmp:
        out = Path(a.keep or tmp)
        tok_dir = out / "tokenizer-src"
        tok_dir.mkdir(parents=True, exist_ok=True)
        hybrid_files.write_tokenizer(tok_dir, vocab=4096, family="qwen3_5")

        result["exports"] = {}
        for recipe in a.recipes:
            print(f"export {recipe} ...", flush=True)
            result["exports"][recipe] = export_in_process_of_its_own(a.preset, recipe, out, tok_dir / "tokenizer.json", a.context,
                                                                         a.gate_steps)
            print(json.dumps({k: v for k, v in result["exports"][recipe].items() if k != "stdout"}), flush=True)
        if "int8keepproj" in a.recipes:
            subprocess.run(["rm", "-rf", str(lowered_path(Bundle.open(out / f"{a.preset}-int8keepproj")))])  # GBs; its gate ran
        bundle_path = out / f"{a.preset}-fp32"
        bundle = Bundle.open(bundle_path)

        print("bench (Core AI) ...", flush=True)
        result["coreai"] = bench_bundle(bundle, steps=a.steps, warmup=a.warmup, prefill_tokens=a.prompts[0])
        print(json.dumps(result["coreai"]), flush=True)
        print("prefill vs the M=1 loop ...", flush=True)
        runs, share = prefill_speed.measure(bundle_path, a.prompts, repeats=1, seed=0)
        result["prefill"] = {"chunk": bundle.manifest.prefill.chunk, "runs": runs, "recurrence": share}

        print("multi-turn ...", flush=True)
        result["multi_turn"] = chat_ttft.measure(bundle, a.history, reply_tokens=16, seed=0)
        result["multi_turn"]["same_call_replay"] = reuse_vs_same_call_replay(bundle, max(a.history // 4, min(a.history, 16)))
        print(json.dumps(result["multi_turn"]), flush=True)

        print("transformers' torch path ...", flush=True)
        model = load_model(a.preset, synthetic=True)
        tokens = bench_tokens(model.config.vocab_size, a.steps + a.warmup)
        start = time.perf_counter()
        hf = TransformersStepper(transformers_model(model))
        result["transformers_build_seconds"] = time.perf_counter() - start
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        one = step_times_ms(hf.step, hf.reset, tokens, a.warmup)
        torch.set_num_threads(threads)
        default = step_times_ms(hf.step, hf.reset, tokens, a.warmup)
        hf.reset()
        compared = tokens[:8]
        theirs = np.stack([hf.step(t) for t in compared])
        del hf
        with Runner(bundle, prefill=False) as runner:
            ours = runner.step_each(compared)
        result["transformers"] = {
            "ms_per_token_1thread": float(np.median(one)), "ms_per_token_default": float(np.median(default)),
            "default_threads": threads, "compared_tokens": len(compared),
            "logits_max_abs_diff_vs_bundle": float(np.abs(ours - theirs).max()),
            "logit_scale": float(np.abs(theirs).max()), "top1_equal": int((ours.argmax(-1) == theirs.argmax(-1)).sum()),
        }  # fmt: skip
        print(json.dumps(result["transformers"]), flush=True)
        subprocess.run(["rm", "-rf", str(lowered_path(bundle))])  # GBs
        result["asset_bytes_on_disk_fp32"] = dir_bytes(bundle.asset_path)
    text = json.dumps(result, indent=2, default=str)
    if a.json:
        Path(a.json).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
