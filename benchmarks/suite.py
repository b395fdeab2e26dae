"""Decode speed of ssmport's Core AI exports against torch eager, a peer, and the machine's
memory bandwidth: one command, one measuring process, results.json + a PNG.

    pip install -e ".[bench]"
    flock /tmp/ssmport-heavy.lock python benchmarks/suite.py            # rwkv7-0.1b, rwkv7-1.5b

Per model (synthetic fp32 weights from the preset's fixed seed, so nothing is downloaded):

  coreai              the exported bundle on the Core AI runtime (single-threaded), timed at
                      the start and again at the end of the model's lines (drift check)
  torch eager         the same ssmport decode module run eagerly, 1 thread and torch's default
  peer                rwkv7: BlinkDL's `rwkv` package, `RWKV_x070` (RWKV_V7_ON=1, JIT on,
                      strategy "cpu fp32"), on the same weights written as a BlinkDL .pth;
                      1 thread and default threads
  roofline            weight bytes read per token (from the bundle's plan) / the single-thread
                      read bandwidth measured in this run (best numpy sum over 512 MB)

Decode is the median ms/token over --steps tokens after --warmup. The machine is shared, so
compare ratios within one run, not absolute times across runs. Exported bundles and peer
checkpoints are cached in --work (outside git), keyed by ssmport's source, so reruns skip the
export. Exports run as subprocesses (a 1.5B fp32 export peaks at ~12.5 GB); every timing runs
in this one process.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

import numpy as np

import ssmport
from ssmport.bench import bench_bundle, bench_tokens, measure_read_bandwidth, step_times_ms
from ssmport.bundle import Bundle
from ssmport.runtime import Runner
from ssmport.sources import DEFAULT_SEED

HERE = Path(__file__).resolve().parent
DEFAULT_MODELS = ("rwkv7-0.1b", "rwkv7-1.5b")
CONTEXTS = (128, 512, 2048, 8192, 32768)


# --------------------------------------------------------------------------------------
# Preparation (cached): the bundle, and the peer's checkpoint
# --------------------------------------------------------------------------------------


def source_key() -> str:
    """Hash of ssmport's own source: a bundle exported by other code is exported again."""
    root = Path(ssmport.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def ensure_bundle(preset: str, work: Path) -> Path:
    out = work / f"bundles-{source_key()}"
    path = out / f"{preset}-fp32"
    if not (path / "manifest.json").is_file():
        cmd = [sys.executable, "-m", "ssmport.cli.main", "export", preset, "--synthetic", "--quant", "fp32",
               "-o", str(out), "--overwrite", "-q"]  # fmt: skip
        print(f"exporting: {shlex.join(cmd)}", flush=True)
        done = subprocess.run(cmd)
        # exit 1: written, but its gate failed; it is timed all the same and its gate reported
        if done.returncode not in (0, 1) or not (path / "manifest.json").is_file():
            raise SystemExit(f"export of {preset} failed (exit {done.returncode})")
    return path


def ensure_blinkdl_pth(preset: str, work: Path) -> Path:
    """The preset's synthetic weights as a BlinkDL .pth (for the `rwkv` package peer)."""
    import torch

    from ssmport.architectures.rwkv7 import _blinkdl_native_shape

    path = work / f"{preset}-synthetic-seed{DEFAULT_SEED}.pth"
    if not path.is_file():
        print(f"writing the peer checkpoint {path}", flush=True)
        model = ssmport.load_model(preset, synthetic=True)
        sd = {n: model.weights[n].reshape(_blinkdl_native_shape(n, model.weights.shape(n))).contiguous()
              for n in model.weights}  # fmt: skip
        tmp = path.with_suffix(".partial")
        torch.save(sd, tmp)
        del sd
        os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------------------
# The lines
# --------------------------------------------------------------------------------------


def summary(times: list[float], **extra) -> dict:
    return {"ms_per_token": float(np.median(times)), "ms_min": float(np.min(times)), "samples": len(times)} | extra


def coreai_line(bundle: Bundle, tokens: list[int], warmup: int) -> list[float]:
    with Runner(bundle) as runner:
        return step_times_ms(runner.step, runner.reset, tokens, warmup)


def torch_eager_lines(preset: str, tokens: list[int], warmup: int) -> dict:
    import torch

    from ssmport.torch_runner import TorchRunner

    lines = {}
    default = torch.get_num_threads()
    ref = TorchRunner(ssmport.load_model(preset, synthetic=True), "fp32")
    try:
        for label, threads in (("torch_eager_1thread", 1), ("torch_eager_default", default)):
            torch.set_num_threads(threads)
            lines[label] = summary(step_times_ms(ref.step, ref.reset, tokens, warmup), threads=threads)
    finally:
        torch.set_num_threads(default)
        ref.close()
    return lines


def rwkv_peer_lines(pth: Path, tokens: list[int], warmup: int) -> dict:
    """BlinkDL's `rwkv` package (RWKV_x070) on the same weights, fp32 on the CPU."""
    os.environ["RWKV_V7_ON"] = "1"
    os.environ.setdefault("RWKV_JIT_ON", "1")
    import torch
    from rwkv.model import RWKV

    model = RWKV(str(pth.with_suffix("")), "cpu fp32")
    holder: dict = {"state": None}

    def step(t: int):
        with torch.no_grad():
            out, holder["state"] = model.forward([t], holder["state"])
        return out

    def reset():
        holder["state"] = None

    lines = {}
    default = torch.get_num_threads()
    try:
        for label, threads in (("peer_1thread", 1), ("peer_default", default)):
            torch.set_num_threads(threads)
            lines[label] = summary(step_times_ms(step, reset, tokens, warmup), threads=threads, peer=f"rwkv=={version('rwkv')} RWKV_x070 cpu fp32")
    finally:
        torch.set_num_threads(default)
        del model
        gc.collect()
    return lines


PEERS = {"rwkv7": (ensure_blinkdl_pth, rwkv_peer_lines)}


def run_model(preset: str, work: Path, steps: int, warmup: int) -> dict:
    bundle = Bundle.open(ensure_bundle(preset, work))
    arch = bundle.manifest["architecture"]
    peer = PEERS.get(arch)
    peer_input = peer[0](preset, work) if peer else None
    gc.collect()

    print(f"[{preset}] Core AI", flush=True)
    vocab = int(bundle.manifest["outputs"][0]["shape"][-1])
    tokens = bench_tokens(vocab, steps + warmup)
    first = bench_bundle(bundle, steps=steps, warmup=warmup, roofline=False)  # loads + first decode pass
    print(f"[{preset}] torch eager", flush=True)
    lines = torch_eager_lines(preset, tokens, warmup)
    gc.collect()
    if peer:
        print(f"[{preset}] peer", flush=True)
        lines |= peer[1](peer_input, tokens, warmup)
        gc.collect()
    print(f"[{preset}] Core AI again", flush=True)
    last_times = coreai_line(bundle, tokens, warmup)
    # The headline is the mean of the first and last passes' medians (they bracket the others).
    again = float(np.median(last_times))
    lines = {"coreai": {"ms_per_token": (first["decode_ms_per_token"] + again) / 2, "first_pass_ms": first["decode_ms_per_token"],
                        "last_pass_ms": again, "samples": 2 * steps}} | lines  # fmt: skip
    cfg = bundle.manifest["config"]
    keys = ("load_s_first", "load_s_cached", "prefill_tokens_per_s", "state_bytes", "asset_bytes", "weight_bytes_per_token")
    return {
        "bundle": bundle.path.name,
        "architecture": arch,
        "gate": {k: (bundle.manifest.get("gate") or {}).get(k) for k in ("passed", "top1_agree", "steps", "max_abs_logit_delta", "max_rel_logit_delta")},
        "layers": cfg.get("num_layers"),
        "width": cfg.get("hidden_size"),
        **{k: first[k] for k in keys},
        "lines": lines,
    }


# --------------------------------------------------------------------------------------
# Derived figures, machine, plot
# --------------------------------------------------------------------------------------


def derive(model: dict, bandwidth: float) -> None:
    """Ratios within the run, and decode against the bandwidth roofline."""
    lines = model["lines"]
    ours = lines["coreai"]["ms_per_token"]
    model["roofline_ms_per_token"] = model["weight_bytes_per_token"] / bandwidth / 1e6
    model["effective_gb_per_s"] = model["weight_bytes_per_token"] / ours / 1e6
    model["roofline_fraction"] = model["roofline_ms_per_token"] / ours
    model["ratios"] = {f"coreai/{k}": ours / v["ms_per_token"] for k, v in lines.items() if k != "coreai"}


def kv_cache_bytes(layers: int, width: int, context: int, dtype_bytes: int = 4) -> int:
    """K and V of a Transformer of the same depth and width (full multi-head attention)."""
    return 2 * layers * width * context * dtype_bytes


def machine() -> dict:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))  # fmt: skip
    except (OSError, StopIteration):
        cpu = platform.processor()
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    versions = {}
    for pkg in ("ssmport", "torch", "coreai-core", "coreai-torch", "numpy", "rwkv", "matplotlib"):
        try:
            versions[pkg] = version(pkg)
        except Exception:  # noqa: BLE001  (an optional package that is absent)
            versions[pkg] = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gb": round(ram / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
        "shared": "yes: other jobs share the CPU; compare ratios within this run",
    }


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = results["models"]
    labels = {"coreai": "ssmport Core AI", "torch_eager_1thread": "torch eager, 1 thread",
              "torch_eager_default": "torch eager, default threads", "peer_1thread": "peer, 1 thread",
              "peer_default": "peer, default threads"}  # fmt: skip
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    names = list(models)
    width = 0.8 / (len(labels) + 1)
    for j, (key, label) in enumerate(labels.items()):
        xs = [i + j * width for i, n in enumerate(names) if key in models[n]["lines"]]
        ys = [models[n]["lines"][key]["ms_per_token"] for n in names if key in models[n]["lines"]]
        ax1.bar(xs, ys, width, label=label)
    ax1.bar([i + len(labels) * width for i in range(len(names))], [models[n]["roofline_ms_per_token"] for n in names],
            width, label="bandwidth roofline", color="0.6", hatch="//")  # fmt: skip
    ax1.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names)
    ax1.set_yscale("log")
    ax1.set_ylabel("decode ms/token (log)")
    ax1.set_title("Decode, fp32, one process (lower is better)")
    ax1.legend(fontsize=8)

    for n in names:
        m = models[n]
        ax2.plot(CONTEXTS, [m["state_bytes"] / 2**20] * len(CONTEXTS), marker="o", label=f"{n}: ssmport state")
        kv = [kv_cache_bytes(m["layers"], m["width"], t) / 2**20 for t in CONTEXTS]
        ax2.plot(CONTEXTS, kv, linestyle="--", label=f"{n}: KV cache of a same-size Transformer")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel("context length (tokens)")
    ax2.set_ylabel("state memory, MiB (fp32, log)")
    ax2.set_title("Decode memory vs context")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(results: dict) -> str:
    rows = ["| model | ssmport Core AI | torch eager 1 thread | torch eager default | peer 1 thread | peer default "
            "| roofline | % of roofline | effective GB/s |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, m in results["models"].items():
        cell = lambda k: f"{m['lines'][k]['ms_per_token']:.1f}" if k in m["lines"] else "n/a"  # noqa: E731
        rows.append(
            f"| {name} | {cell('coreai')} | {cell('torch_eager_1thread')} | {cell('torch_eager_default')} "
            f"| {cell('peer_1thread')} | {cell('peer_default')} | {m['roofline_ms_per_token']:.1f} "
            f"| {100 * m['roofline_fraction']:.0f}% | {m['effective_gb_per_s']:.1f} |"
        )
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated presets")
    p.add_argument("--steps", type=int, default=64, help="timed tokens per line (default 64)")
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--work", type=Path, default=Path(os.environ.get("SSMPORT_BENCH_WORK", Path.home() / ".cache" / "ssmport-bench")),
                   help="cache of exported bundles and peer checkpoints (outside git)")  # fmt: skip
    p.add_argument("--out", type=Path, default=HERE / "results.json")
    p.add_argument("--plot", type=Path, default=HERE / "results.png")
    a = p.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)

    results: dict = {
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "load_average_start": os.getloadavg(),
        "steps": a.steps,
        "warmup": a.warmup,
        "models": {},
    }
    bandwidth = [measure_read_bandwidth()]
    for preset in a.models.split(","):
        results["models"][preset] = run_model(preset, a.work, a.steps, a.warmup)
        bandwidth.append(measure_read_bandwidth())
    results["read_bandwidth_gb_per_s"] = {"samples": bandwidth, "used": max(bandwidth)}
    for m in results["models"].values():
        derive(m, max(bandwidth))
    results["load_average_end"] = os.getloadavg()
    results["finished_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    results["state_vs_context"] = {
        "contexts": list(CONTEXTS),
        "kv_cache_model": "2 * layers * width * context * 4 bytes (fp32 K and V, full multi-head attention)",
    }
    a.out.write_text(json.dumps(results, indent=2) + "\n")
    plot(results, a.plot)
    print(table(results))
    print(f"wrote {a.out} and {a.plot}")


if __name__ == "__main__":
    main()
