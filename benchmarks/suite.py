"""Decode speed of ssmport's Core AI exports against torch eager, a peer, and the machine's
memory bandwidth: one command, one measuring process, results.json + a PNG.

    pip install -e ".[bench]"
    flock /tmp/ssmport-heavy.lock python benchmarks/suite.py     # the four models below

Default models: rwkv7-0.1b, rwkv7-1.5b, mamba2-130m, gated-deltanet-340m. Per model
(synthetic fp32 weights from the preset's fixed seed, so nothing is downloaded):

  coreai              the exported bundle on the Core AI runtime (single-threaded), timed at
                      the start and again at the end of the model's lines (drift check)
  torch eager         the same ssmport decode module run eagerly, 1 thread and torch's default
  peer                another implementation on the same weights, 1 thread and default threads:
                      rwkv7: BlinkDL's `rwkv` package, `RWKV_x070` (RWKV_V7_ON=1, JIT on,
                        strategy "cpu fp32"), the weights written as a BlinkDL .pth
                      rwkv6: the same package's `RWKV_x060` (RWKV_V7_ON unset; one RWKV
                        generation per process, so rwkv6 and rwkv7 presets run apart)
                      mamba2: transformers' `Mamba2ForCausalLM`, its pure-torch path (no
                        mamba_ssm / causal_conv1d / hub kernels), one token per call with its
                        cache, the weights written as a transformers folder; mamba1 the same
                        with `MambaForCausalLM` / `FalconMambaForCausalLM`
                      olmo_hybrid, falcon_h1, lfm2, granitemoehybrid, nemotron_h, lfm2_moe, qwen3_5,
                        lfm3, recurrent_gemma: transformers' own class on the weights in memory
                        (benchmarks/hybrid_speed.py's peer; recurrent_gemma's keeps a cache of its
                        own, and is refused where lru_width != hidden_size)
                      gated_deltanet: none (see NO_PEER)
  mlx-lm              mlx-lm on MLX's CPU backend, same weights as the HF folder it loads
                      (benchmarks/peers_mlx.py), one token per call with its cache, pinned to
                      one CPU and as it comes (MLX has no thread setting: peers_mlx says how it
                      is threaded); rwkv7 and mamba2 (MLX_LM_FOLDERS), skipped with the reason
                      where mlx is not installed (NO_MLX_LM for an architecture mlx-lm lacks)
                      Before it is timed, each peer (this and the one above) must agree with
                      ssmport's torch module on the first PEER_CHECK_TOKENS tokens' logits (max
                      |Δ| <= PEER_MAX_REL_DELTA of the logit scale); one that does not is
                      refused: no line, the reason kept
  roofline            weight bytes read per token (from the bundle's plan) / the single-thread
                      read bandwidth measured in this run (best numpy sum over 512 MB)

Decode is the median ms/token over --steps tokens after --warmup; each torch / peer line also
records the process's CPU seconds per wall second (cpu_per_wall) and how many of its threads
were busy (threads_busy). The machine is shared, so
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
from contextlib import contextmanager, nullcontext
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

import numpy as np
import peers_mlx

import ssmport
from ssmport.bench import bench_bundle, bench_tokens, measure_read_bandwidth, step_times_ms
from ssmport.bundle import Bundle
from ssmport.runtime import Runner
from ssmport.loader.resolve import DEFAULT_SEED

HERE = Path(__file__).resolve().parent
DEFAULT_MODELS = ("rwkv7-0.1b", "rwkv7-1.5b", "mamba2-130m", "gated-deltanet-340m")
CONTEXTS = (128, 512, 2048, 8192, 32768)
# A peer is timed only if it computes the same function: over its first PEER_CHECK_TOKENS
# tokens (teacher-forced from a zero state), max |Δlogits| against ssmport's torch module must
# stay within PEER_MAX_REL_DELTA of the logit scale (the reference's max |logit|, at least 1).
# fp32 implementations differ by summation order: 1.3e-3 of scale at worst measured (rwkv7-1.5b
# synthetic, export form vs fp64; benchmarks/README.md); a wrong weight or formula is O(1).
PEER_CHECK_TOKENS = 8
PEER_MAX_REL_DELTA = 1e-2


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
    """The preset's synthetic weights as a BlinkDL .pth (for the `rwkv` package peer), in its
    family's layout (x070 or x060)."""
    import importlib

    import torch

    path = work / f"{preset}-synthetic-seed{DEFAULT_SEED}.pth"
    if not path.is_file():
        print(f"writing the peer checkpoint {path}", flush=True)
        model = ssmport.load_model(preset, synthetic=True)
        blinkdl_storage = importlib.import_module(f"ssmport.models.{model.architecture.name}.checkpoints").blinkdl_storage
        storage = blinkdl_storage({n: model.weights.shape(n) for n in model.weights})
        sd = {n: model.weights[n].reshape(stored.shapes(model.weights.shape(n))[0]).contiguous()
              for n, (_, stored) in storage.items()}  # fmt: skip
        tmp = path.with_suffix(".partial")
        torch.save(sd, tmp)
        del sd
        os.replace(tmp, path)
    return path


def transformers_peer_folder(preset: str, work: Path, convert) -> Path:
    """The preset's synthetic weights as a transformers folder (config.json + model.safetensors,
    `convert(preset, model) -> (config, tensors)`), written once beside its place and renamed in."""
    import shutil

    from safetensors.torch import save_file

    path = work / f"{preset}-synthetic-seed{DEFAULT_SEED}-transformers"
    if (path / "model.safetensors").is_file():
        return path
    print(f"writing the peer checkpoint {path}", flush=True)
    config, tensors = convert(preset, ssmport.load_model(preset, synthetic=True))
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(tmp / "model.safetensors"))
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    return path


def ensure_mamba2_folder(preset: str, work: Path) -> Path:
    """The preset's synthetic weights as a transformers `Mamba2ForCausalLM` folder (config.json
    + model.safetensors), for the transformers peer."""
    return transformers_peer_folder(preset, work, _mamba2_as_transformers)


def _mamba2_as_transformers(preset: str, model) -> tuple[dict, dict]:
    from ssmport.models.mamba2.checkpoints import checkpoint_names as _checkpoint_names

    c = model.config
    if c.intermediate_size % c.hidden_size:
        raise SystemExit(f"{preset}: d_inner {c.intermediate_size} is not an integer expand of {c.hidden_size}")
    # ssmport's own canonical -> transformers name table; the conv is stored as nn.Conv1d [C, 1, K].
    names = _checkpoint_names(c, "backbone.embeddings.weight", "lm_head.weight")
    tensors = {theirs: model.weights[ours].reshape(c.conv_dim, 1, c.conv_kernel) if ours.endswith("conv1d.weight")
               else model.weights[ours].contiguous() for ours, theirs in names.items()}  # fmt: skip
    config = {
        "model_type": "mamba2", "architectures": ["Mamba2ForCausalLM"], "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size, "num_hidden_layers": c.num_layers, "num_heads": c.num_heads,
        "head_dim": c.head_dim, "expand": c.intermediate_size // c.hidden_size, "state_size": c.state_size,
        "n_groups": c.n_groups, "conv_kernel": c.conv_kernel, "use_conv_bias": c.use_conv_bias,
        "use_bias": c.use_bias, "hidden_act": "silu", "layer_norm_epsilon": c.norm_eps,
        "residual_in_fp32": c.residual_in_fp32, "tie_word_embeddings": False,
        "time_step_limit": [c.dt_min, c.dt_max if c.dt_max is not None else {"__float__": "Infinity"}],
    }  # fmt: skip
    return config, tensors


def ensure_mamba1_folder(preset: str, work: Path) -> Path:
    """The preset's synthetic weights as a transformers `MambaForCausalLM` / `FalconMambaForCausalLM`
    folder (config.json + model.safetensors, head untied), for the transformers peer."""
    return transformers_peer_folder(preset, work, _mamba1_as_transformers)


def _mamba1_as_transformers(preset: str, model) -> tuple[dict, dict]:
    c = model.config
    # transformers' names are ssmport's canonical ones under "backbone." (the head aside); the conv is [I, 1, K]
    tensors = {("" if n == "lm_head.weight" else "backbone.") + n:
               model.weights[n].reshape(c.intermediate_size, 1, c.conv_kernel) if n.endswith("conv1d.weight")
               else model.weights[n].contiguous() for n in model.weights}  # fmt: skip
    falcon = c.bcdt_norm_eps is not None
    config = {
        "model_type": "falcon_mamba" if falcon else "mamba",
        "architectures": ["FalconMambaForCausalLM" if falcon else "MambaForCausalLM"], "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size, "num_hidden_layers": c.num_layers, "expand": c.intermediate_size // c.hidden_size,
        "state_size": c.state_size, "time_step_rank": c.dt_rank, "conv_kernel": c.conv_kernel,
        "use_conv_bias": c.use_conv_bias, "use_bias": c.use_bias, "hidden_act": "silu", "layer_norm_epsilon": c.norm_eps,
        "residual_in_fp32": c.residual_in_fp32, "tie_word_embeddings": False,
    } | ({"mixer_rms_eps": c.bcdt_norm_eps} if falcon else {})  # fmt: skip
    return config, tensors


# --------------------------------------------------------------------------------------
# The lines
# --------------------------------------------------------------------------------------


def summary(times: list[float], **extra) -> dict:
    return {"ms_per_token": float(np.median(times)), "ms_min": float(np.min(times)), "samples": len(times)} | extra


def coreai_line(bundle: Bundle, tokens: list[int], warmup: int) -> list[float]:
    with Runner(bundle) as runner:
        runner.page_in()  # its embedding rows read from memory, as the peers' are
        return step_times_ms(runner.step, runner.reset, tokens, warmup)


def timed_line(step, reset, tokens: list[int], warmup: int, **extra) -> dict:
    """One line's summary, with how many cores the implementation kept busy, measured rather
    than assumed (warm-up included): the process's CPU seconds per wall second, and how many
    of its threads ran for more than a tenth of the time (None where /proc is missing)."""
    cpu, wall, threads = time.process_time(), time.perf_counter(), thread_cpu_seconds()
    times = step_times_ms(step, reset, tokens, warmup)
    wall = time.perf_counter() - wall
    busy = (time.process_time() - cpu) / wall
    after = thread_cpu_seconds()
    busy_threads = None if threads is None else sum(s - threads.get(t, 0.0) > 0.1 * wall for t, s in after.items())
    return summary(times, cpu_per_wall=round(busy, 2), threads_busy=busy_threads, **extra)


def thread_cpu_seconds() -> dict[int, float] | None:
    """CPU seconds (user + system) of each thread of this process so far (Linux /proc)."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return None
    tick, seconds = os.sysconf("SC_CLK_TCK"), {}
    for task in tasks.iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()  # fields 3.. of proc_pid_stat(5)
        except OSError:  # the thread has exited
            continue
        seconds[int(task.name)] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return seconds


@contextmanager
def torch_threads(n: int):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# --one-thread: only the 1-thread lines (several runs sharing one machine, each on its own core)
ONE_THREAD_ONLY = False


def torch_thread_settings() -> list[tuple[str, dict, object]]:
    """(suffix, what the line records of it, context) of the two torch lines: 1 thread and
    torch's default (only the first under ONE_THREAD_ONLY)."""
    import torch

    default = torch.get_num_threads()
    one = [("1thread", {"threads": 1}, torch_threads(1))]
    return one if ONE_THREAD_ONLY else one + [("default", {"threads": default}, torch_threads(default))]


def thread_lines(prefix: str, step, reset, tokens: list[int], warmup: int, settings=None, **extra) -> dict:
    """`prefix`_1thread and `prefix`_default: the same step timed under each thread setting
    (torch's thread count unless `settings` says otherwise)."""
    lines = {}
    for suffix, setting, context in settings or torch_thread_settings():
        with context:
            lines[f"{prefix}_{suffix}"] = timed_line(step, reset, tokens, warmup, **setting, **extra)
    return lines


def torch_eager_lines(preset: str, tokens: list[int], warmup: int) -> tuple[dict, np.ndarray]:
    """The torch eager lines, and the logits of its first PEER_CHECK_TOKENS tokens from a zero
    state (what a peer must reproduce)."""
    from ssmport.gate.torch_runner import TorchRunner

    ref = TorchRunner(ssmport.load_model(preset, synthetic=True), "fp32")
    try:
        ref.reset()
        check_logits = ref.step_each(tokens[:PEER_CHECK_TOKENS])
        return thread_lines("torch_eager", ref.step, ref.reset, tokens, warmup), check_logits
    finally:
        ref.close()


class Peer:
    """Another implementation of the model: `step(token) -> logits`, `reset()`, `close()`."""

    name: str

    def step(self, token: int) -> np.ndarray:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        gc.collect()


class RwkvPackagePeer(Peer):
    """BlinkDL's `rwkv` package (RWKV_x070) on the same weights, fp32 on the CPU."""

    generation = "x070"

    def __init__(self, pth: Path):
        # the package picks its model class from RWKV_V7_ON once, when rwkv.model is imported
        if "rwkv.model" in sys.modules and os.environ.get("RWKV_V7_ON") != ("1" if self.generation == "x070" else None):
            raise SystemExit("the rwkv package serves one RWKV generation per process: run rwkv6 and rwkv7 apart")
        if self.generation == "x070":
            os.environ["RWKV_V7_ON"] = "1"
        else:
            os.environ.pop("RWKV_V7_ON", None)
            os.environ["RWKV_CUDA_ON"] = "0"
        os.environ.setdefault("RWKV_JIT_ON", "1")
        from rwkv.model import RWKV

        self.name = f"rwkv=={version('rwkv')} RWKV_{self.generation} cpu fp32"
        self.model = RWKV(str(pth.with_suffix("")), "cpu fp32")
        self.state = None

    def step(self, token: int) -> np.ndarray:
        import torch

        with torch.no_grad():
            out, self.state = self.model.forward([token], self.state)
        return out.float().numpy()

    def reset(self) -> None:
        self.state = None

    def close(self) -> None:
        del self.model
        super().close()


class RwkvX060Peer(RwkvPackagePeer):
    """The `rwkv` package's RWKV-6 (x060) model class on the same weights."""

    generation = "x060"

    def __init__(self, pth: Path):
        import torch

        # its x060 class splits the heads by n_embd: a model whose dim_att differs (rwkv6-tiny) it cannot run
        key = torch.load(pth, map_location="cpu", mmap=True, weights_only=True)["blocks.0.att.key.weight"]
        if key.shape[0] != key.shape[1]:
            raise PeerRefusal(f"the rwkv package runs x060 only with dim_att == n_embd; this model has dim_att "
                              f"{key.shape[0]}, n_embd {key.shape[1]}")  # fmt: skip
        super().__init__(pth)


class PeerRefusal(Exception):
    """A peer that cannot run this model: its line is left out, the reason recorded."""


def hybrid_preset(preset: str, work: Path) -> str:
    """The transformers hybrid peer builds its model in memory from the preset's synthetic
    weights (benchmarks/hybrid_speed.py): nothing is written."""
    return preset


def open_transformers_hybrid(preset: str) -> Peer:
    """transformers' own class of a hybrid on the preset's synthetic weights, its torch path:
    benchmarks/hybrid_speed.py's peer (imported here, as it imports this module)."""
    import hybrid_speed

    return hybrid_speed.open_peer(hybrid_speed.synthetic_model(preset))


# The functions of transformers' Mamba2Mixer that a kernel package or the `kernels` hub would
# replace; each must dispatch to its own torch body.
MAMBA2_KERNEL_FUNCTIONS = ("causal_conv1d_update", "causal_conv1d_fn", "mamba2_selective_state_update",
                           "mamba2_chunk_scan", "mamba2_split_conv1d_scan_combined")  # fmt: skip


# The same for transformers' MambaMixer / FalconMambaMixer (Mamba-1).
MAMBA1_KERNEL_FUNCTIONS = ("causal_conv1d_update", "causal_conv1d_fn", "mamba_inner_fn", "mamba_selective_state_update",
                           "mamba_selective_scan")  # fmt: skip


def require_torch_path_mamba2(module: str = "mamba2", functions: tuple[str, ...] = MAMBA2_KERNEL_FUNCTIONS) -> str:
    """Refuse unless transformers' Mamba-2 (or `module`'s) mixer runs its pure-torch functions: no
    `kernels` hub, mamba_ssm or causal_conv1d could swap one in. Returns how that was checked."""
    import importlib
    import importlib.util
    import inspect

    modeling_mamba2 = importlib.import_module(f"transformers.models.{module}.modeling_{module}")

    for package in ("kernels", "mamba_ssm", "causal_conv1d"):
        if importlib.util.find_spec(package) is not None:
            raise SystemExit(f"transformers peer: `{package}` is installed, so {module} may not run its torch path")
    for name in functions:
        fn = getattr(modeling_mamba2, name)
        # transformers' fallback wrapper keeps the function it dispatches to in its closure.
        chosen = inspect.getclosurevars(fn).nonlocals.get("implementation")
        if chosen is None or chosen is not getattr(fn, "__wrapped__", None):
            raise SystemExit(f"transformers peer: {name} does not dispatch to transformers' torch body")
    return "no kernels / mamba_ssm / causal_conv1d installed; each mixer function dispatches to its torch body"


class TransformersMamba2Peer(Peer):
    """transformers' Mamba2ForCausalLM (or the model class of the folder's `model_type`, with
    its mixer's kernel-replaceable functions), pure-torch path, fp32 CPU, one token per call with its cache."""

    model_class, module, functions = "Mamba2ForCausalLM", "mamba2", MAMBA2_KERNEL_FUNCTIONS

    def __init__(self, folder: Path):
        import torch
        import transformers

        self.torch_path = require_torch_path_mamba2(self.module, self.functions)
        self.model, info = getattr(transformers, self.model_class).from_pretrained(
            str(folder), dtype=torch.float32, use_kernels=False, output_loading_info=True)  # fmt: skip
        self.model.eval()
        unloaded = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        if unloaded:
            raise SystemExit(f"transformers peer: {folder} did not load strictly: {unloaded}")
        self.name = f"transformers=={version('transformers')} {self.model_class} torch path, cpu fp32, use_cache"
        self.cache = None

    def step(self, token: int) -> np.ndarray:
        import torch

        with torch.no_grad():
            out = self.model(torch.tensor([[token]]), cache_params=self.cache, use_cache=True)
        self.cache = out.cache_params
        return out.logits[0, -1].float().numpy()

    def reset(self) -> None:
        self.cache = None

    def close(self) -> None:
        del self.model, self.cache
        super().close()


class TransformersMamba1Peer(TransformersMamba2Peer):
    """transformers' MambaForCausalLM / FalconMambaForCausalLM, as the folder's config says."""

    functions = MAMBA1_KERNEL_FUNCTIONS

    def __init__(self, folder: Path):
        falcon = json.loads((folder / "config.json").read_text())["model_type"] == "falcon_mamba"
        self.model_class = "FalconMambaForCausalLM" if falcon else "MambaForCausalLM"
        self.module = "falcon_mamba" if falcon else "mamba"
        super().__init__(folder)


# architecture -> (write the peer's checkpoint of a preset (cached), open a Peer on it)
PEERS = {
    "rwkv7": (ensure_blinkdl_pth, RwkvPackagePeer),
    "rwkv6": (ensure_blinkdl_pth, RwkvX060Peer),
    "mamba2": (ensure_mamba2_folder, TransformersMamba2Peer),
    "mamba1": (ensure_mamba1_folder, TransformersMamba1Peer),
    **{arch: (hybrid_preset, open_transformers_hybrid)
       for arch in ("olmo_hybrid", "falcon_h1", "lfm2", "granitemoehybrid", "nemotron_h", "lfm2_moe", "qwen3_5", "lfm3",
                    "recurrent_gemma")},  # hybrid_speed's
}
# architecture -> why it has no peer line
NO_PEER = {
    "gated_deltanet": "no CPU implementation of the model to compare with: fla's GatedDeltaNetForCausalLM "
    "(the reference implementation) runs its layers through Triton kernels, which need a GPU, and "
    "transformers has no Gated DeltaNet LM (Qwen3-Next uses the rule inside a different hybrid model)",
}


def peer_agreement(reference: np.ndarray, got: np.ndarray) -> dict:
    """max |Δlogits| of a peer against ssmport's torch module, absolute and relative to the
    logit scale, and top-1 agreement; `passed` if within PEER_MAX_REL_DELTA."""
    ref, got = reference.astype(np.float64), got.astype(np.float64)
    scale = max(1.0, float(np.abs(ref).max()))
    delta = float(np.abs(ref - got).max())
    return {
        "tokens": len(ref),
        "max_abs_logit_delta": delta,
        "logit_scale": scale,
        "max_rel_logit_delta": delta / scale,
        "limit_rel": PEER_MAX_REL_DELTA,
        "top1_agree": int((ref.argmax(-1) == got.argmax(-1)).sum()),
        "passed": delta / scale <= PEER_MAX_REL_DELTA,
    }


def peer_lines(peer: Peer, reference: np.ndarray, tokens: list[int], warmup: int, prefix: str = "peer",
               settings=None) -> tuple[dict, dict]:  # fmt: skip
    """(lines, peer record): the peer is checked against ssmport's logits, then timed (as
    `prefix`_1thread / _default, under `settings`: see thread_lines) if it agrees."""
    peer.reset()
    check = peer_agreement(reference, np.stack([peer.step(t) for t in tokens[: len(reference)]]))
    record = {"name": peer.name, "agreement": check} | ({"torch_path": peer.torch_path} if hasattr(peer, "torch_path") else {})
    verdict = "agrees" if check["passed"] else "REFUSED: computes something else"
    print(f"  {prefix} vs ssmport torch, {check['tokens']} tokens: max |Δlogits| {check['max_abs_logit_delta']:.3g} "
          f"({check['max_rel_logit_delta']:.2e} of scale {check['logit_scale']:.3g}; limit {PEER_MAX_REL_DELTA:g}), "
          f"top-1 {check['top1_agree']}/{check['tokens']}: {verdict}", flush=True)  # fmt: skip
    if not check["passed"]:
        record["refused"] = f"max |Δlogits| {check['max_rel_logit_delta']:.2e} of scale > {PEER_MAX_REL_DELTA:g}"
        if getattr(peer, "known_differences", None):  # what its source does differently, where known
            record["likely_cause"] = peer.known_differences
        return {}, record
    return thread_lines(prefix, peer.step, peer.reset, tokens, warmup, settings, peer=peer.name), record


# --------------------------------------------------------------------------------------
# The mlx-lm line (benchmarks/peers_mlx.py): optional, every architecture mlx-lm has
# --------------------------------------------------------------------------------------


def ensure_mlx_rwkv7_folder(preset: str, work: Path) -> Path:
    """The preset's synthetic weights as the RWKV-7 folder mlx-lm loads (fla's names)."""
    path = work / f"{preset}-synthetic-seed{DEFAULT_SEED}-mlx-lm"
    if not (path / "model.safetensors").is_file():
        print(f"writing the mlx-lm checkpoint {path}", flush=True)
        peers_mlx.write_rwkv7_folder(ssmport.load_model(preset, synthetic=True), path)
    return path


def ensure_mlx_mamba2_folder(preset: str, work: Path) -> Path:
    """The transformers peer's Mamba-2 folder, seen by mlx-lm (its files linked, its config in
    mlx-lm's keys)."""
    view = work / f"{preset}-synthetic-seed{DEFAULT_SEED}-mlx-lm"
    return peers_mlx.mlx_lm_view(ensure_mamba2_folder(preset, work), view)


# architecture -> write the mlx-lm folder of a preset. A hybrid gets its line by an entry that
# writes the preset's synthetic weights as a transformers folder and returns
# peers_mlx.mlx_lm_view of it (tests/test_bench_mlx.py checks each hybrid's view against
# transformers on tests/hybrid_files.py's fixtures).
MLX_LM_FOLDERS = {
    "rwkv7": ensure_mlx_rwkv7_folder,
    "mamba2": ensure_mlx_mamba2_folder,
}
NO_MLX_LM = {
    "gated_deltanet": "mlx-lm has no Gated DeltaNet LM (its gated_delta.py is the mixer inside its Qwen3-Next and "
    "Qwen3.5 hybrids)",
}


def mlx_thread_settings() -> list[tuple[str, dict, object]]:
    """MLX has no thread setting (peers_mlx's docstring): "1thread" pins the whole process to
    one CPU, "default" leaves it on every CPU it may use."""
    return [("1thread", {"cpus": 1}, peers_mlx.one_cpu()),
            ("default", {"cpus": len(os.sched_getaffinity(0))}, nullcontext())]  # fmt: skip


def prepare_mlx_lm(arch: str, preset: str, work: Path) -> Path | dict:
    """The mlx-lm folder for this preset, or the record of why there is no mlx-lm line."""
    missing = peers_mlx.mlx_missing()
    if missing:
        return {"none": missing}
    if arch not in MLX_LM_FOLDERS:
        return {"none": NO_MLX_LM.get(arch, f"no mlx-lm folder writer is registered for {arch} (MLX_LM_FOLDERS)")}
    try:
        return MLX_LM_FOLDERS[arch](preset, work)
    except peers_mlx.MlxRefusal as e:
        return {"refused": str(e)}


def mlx_lm_lines(prepared: Path | dict, reference: np.ndarray, tokens: list[int], warmup: int) -> tuple[dict, dict]:
    """(lines, record) of mlx-lm on a folder from prepare_mlx_lm, checked before it is timed."""
    if isinstance(prepared, dict):
        return {}, prepared
    try:
        peer = peers_mlx.MlxLmPeer(prepared)
    except peers_mlx.MlxRefusal as e:
        return {}, {"refused": str(e)}
    try:
        return peer_lines(peer, reference, tokens, warmup, prefix="mlx_lm", settings=mlx_thread_settings())
    finally:
        peer.close()


def run_model(preset: str, work: Path, steps: int, warmup: int) -> dict:
    bundle = Bundle.open(ensure_bundle(preset, work))
    arch = bundle.manifest.architecture
    peer = PEERS.get(arch)
    peer_input = peer[0](preset, work) if peer else None
    mlx_input = prepare_mlx_lm(arch, preset, work)
    gc.collect()

    print(f"[{preset}] Core AI", flush=True)
    vocab = bundle.manifest.vocab_size
    tokens = bench_tokens(vocab, steps + warmup)
    first = bench_bundle(bundle, steps=steps, warmup=warmup, roofline=False)  # loads + first decode pass
    print(f"[{preset}] torch eager", flush=True)
    lines, check_logits = torch_eager_lines(preset, tokens, warmup)
    gc.collect()
    if peer:
        print(f"[{preset}] peer", flush=True)
        try:
            opened = peer[1](peer_input)
        except PeerRefusal as e:
            opened, peer_record = None, {"refused": str(e)}
            print(f"[{preset}] no peer line: {e}", flush=True)
        if opened is not None:
            try:
                peer_timed, peer_record = peer_lines(opened, check_logits, tokens, warmup)
            finally:
                opened.close()
            lines |= peer_timed
    else:
        peer_record = {"none": NO_PEER.get(arch, f"no peer is registered for {arch} (PEERS)")}
        print(f"[{preset}] no peer: {peer_record['none']}", flush=True)
    print(f"[{preset}] mlx-lm", flush=True)
    mlx_timed, mlx_record = mlx_lm_lines(mlx_input, check_logits, tokens, warmup)
    if not mlx_timed:
        print(f"[{preset}] no mlx-lm line: {mlx_record.get('none') or mlx_record.get('refused')}", flush=True)
    lines |= mlx_timed
    gc.collect()
    print(f"[{preset}] Core AI again", flush=True)
    last_times = coreai_line(bundle, tokens, warmup)
    # The headline is the mean of the first and last passes' medians (they bracket the others).
    again = float(np.median(last_times))
    lines = {"coreai": {"ms_per_token": (first["decode_ms_per_token"] + again) / 2, "first_pass_ms": first["decode_ms_per_token"],
                        "last_pass_ms": again, "samples": 2 * steps}} | lines  # fmt: skip
    cfg = bundle.manifest.config
    keys = ("load_s_first", "load_s_cached", "prefill_tokens_per_s", "state_bytes", "asset_bytes", "weight_bytes_per_token",
            "ops_per_decode_call", "ops_per_prefill_chunk")  # fmt: skip
    return {
        "bundle": bundle.path.name,
        "architecture": arch,
        "gate": {k: getattr(bundle.manifest.gate, k, None) for k in ("passed", "top1_agree", "steps", "max_abs_logit_delta", "max_rel_logit_delta")},
        "layers": cfg.get("num_layers"),
        "width": cfg.get("hidden_size"),
        **{k: first[k] for k in keys},
        "peer": peer_record,
        "mlx_lm": mlx_record,
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
    for pkg in ("ssmport", "torch", "coreai-core", "coreai-torch", "numpy", "rwkv", "transformers", "mlx", "mlx-lm",
                "matplotlib"):
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
              "torch_eager_default": "torch eager, default threads", "peer_1thread": "peer (rwkv / transformers), 1 thread",
              "peer_default": "peer, default threads", "mlx_lm_1thread": "mlx-lm (MLX CPU), pinned to 1 CPU",
              "mlx_lm_default": "mlx-lm, default"}  # fmt: skip
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    names = list(models)
    width = 0.8 / (len(labels) + 1)
    for j, (key, label) in enumerate(labels.items()):
        xs = [i + j * width for i, n in enumerate(names) if key in models[n]["lines"]]
        ys = [models[n]["lines"][key]["ms_per_token"] for n in names if key in models[n]["lines"]]
        ax1.bar(xs, ys, width, label=label)
    ax1.bar([i + len(labels) * width for i in range(len(names))], [models[n]["roofline_ms_per_token"] for n in names],
            width, label="bandwidth roofline", color="0.6", hatch="//")  # fmt: skip
    for i, n in enumerate(names):  # say why a model has no bars of a peer
        for prefix, record, first in (("peer", "peer", 3), ("mlx_lm", "mlx_lm", 5)):
            if not any(k.startswith(prefix + "_") for k in models[n]["lines"]):
                why = f"{prefix} {missing_word(models[n].get(record, {}))}"
                ax1.text(i + (first + 0.5) * width, 0.02, why, rotation=90, fontsize=7, ha="center", va="bottom",
                         transform=ax1.get_xaxis_transform())  # fmt: skip
    ax1.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names)
    ax1.set_yscale("log")
    ax1.set_ylabel("decode ms/token (log)")
    ax1.set_title("Decode, fp32, one process (lower is better)")
    ax1.legend(fontsize=8)

    for j, n in enumerate(names):  # one colour per model: its state (solid), a KV cache (dashed)
        m, color = models[n], f"C{j}"
        ax2.plot(CONTEXTS, [m["state_bytes"] / 2**20] * len(CONTEXTS), marker="o", color=color, label=f"{n}: ssmport state")
        if m["layers"] and m["width"]:  # a manifest without num_layers (a hybrid's layer_types) has no such line
            kv = [kv_cache_bytes(m["layers"], m["width"], t) / 2**20 for t in CONTEXTS]
            ax2.plot(CONTEXTS, kv, linestyle="--", color=color, label=f"{n}: KV cache, same-size Transformer")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel("context length (tokens)")
    ax2.set_ylabel("state memory, MiB (fp32, log)")
    ax2.set_title("Decode memory vs context")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def missing_word(record: dict) -> str:
    """Why a peer has no line, in a word: its record says refused or none (n/a: not run)."""
    return "refused" if "refused" in record else "none" if "none" in record else "n/a"


def table(results: dict) -> str:
    rows = ["| model | ssmport Core AI | torch eager 1 thread | torch eager default | peer 1 thread | peer default "
            "| mlx-lm 1 CPU | mlx-lm default | roofline | % of roofline | effective GB/s | runtime ops per decode call |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, m in results["models"].items():

        def cell(k: str) -> str:
            if k in m["lines"]:
                return f"{m['lines'][k]['ms_per_token']:.1f}"
            return missing_word(m.get("mlx_lm" if k.startswith("mlx_lm") else "peer", {}))

        rows.append(
            f"| {name} | {cell('coreai')} | {cell('torch_eager_1thread')} | {cell('torch_eager_default')} "
            f"| {cell('peer_1thread')} | {cell('peer_default')} | {cell('mlx_lm_1thread')} | {cell('mlx_lm_default')} "
            f"| {m['roofline_ms_per_token']:.1f} "
            f"| {100 * m['roofline_fraction']:.0f}% | {m['effective_gb_per_s']:.1f} | {m.get('ops_per_decode_call', 'n/a')} |"
        )
    return "\n".join(rows)


def parse_models(args: list[str]) -> list[str]:
    """Preset names from space- and/or comma-separated arguments, in order, each once; an
    unknown name is a one-line error before anything runs."""
    from ssmport.architectures import presets

    names = list(dict.fromkeys(n for arg in args for n in arg.split(",") if n))
    known = presets()
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise SystemExit(f"--models: unknown preset(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(sorted(known))}")
    return names


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS),
                   help=f"presets, space- or comma-separated (default: {' '.join(DEFAULT_MODELS)})")  # fmt: skip
    p.add_argument("--steps", type=int, default=64, help="timed tokens per line (default 64)")
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--work", type=Path, default=Path(os.environ.get("SSMPORT_BENCH_WORK", Path.home() / ".cache" / "ssmport-bench")),
                   help="cache of exported bundles and peer checkpoints (outside git)")  # fmt: skip
    p.add_argument("--out", type=Path, default=HERE / "results.json", help="results JSON (default benchmarks/results.json)")
    p.add_argument("--plot", type=Path, help="the PNG (default: --out with .png)")
    p.add_argument("--one-thread", action="store_true",
                   help="only the 1-thread torch and peer lines (no default-threads line: for runs sharing a machine)")  # fmt: skip
    a = p.parse_args()
    global ONE_THREAD_ONLY
    ONE_THREAD_ONLY = a.one_thread
    models = parse_models(a.models)
    plot_path = a.plot or a.out.with_suffix(".png")
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
    for preset in models:
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
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    try:
        plot(results, plot_path)
        print(f"wrote {a.out} and {plot_path}")
    except ModuleNotFoundError as e:  # matplotlib comes with the [bench] extra; the table and JSON stand without it
        print(f"wrote {a.out}; no plot ({e})")


if __name__ == "__main__":
    main()
