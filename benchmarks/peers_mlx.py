"""mlx-lm on MLX's CPU backend as a peer of benchmarks/suite.py: the same weights, written as
the Hugging Face folder mlx-lm loads, decoded one token per call with mlx-lm's own cache.

    pip install -e ".[bench]"      # mlx[cpu] and mlx-lm (pinned in pyproject.toml)

How MLX's CPU backend is threaded (mlx 0.32.4, the `mlx[cpu]` wheel for Linux x86_64; read
from its library and measured, benchmarks/README.md): every operation of a stream runs on
that stream's one worker thread (the CPU command encoder has no thread pool; MLX's issue
#2185 and #1218 say the same), and its matmuls call `cblas_sgemm` from the BLAS bundled in
`mlx_cpu.libs`, netlib's reference BLAS 3.10, which starts no threads. There is no thread
setting. So MLX computes on one thread whatever the machine has; the suite shows it rather
than assumes it: its "1 thread" line pins every thread of the process to one CPU
(`sched_setaffinity`), its "default" line leaves them as they are, and every line records
the process's CPU seconds per wall second.

mlx-lm reads each family's Hugging Face config in its own keys; `mlx_lm_view` writes a
folder it loads strictly (the same safetensors files, linked; config.json in mlx-lm's keys)
or refuses with the reason (`MlxRefusal`). Agreement is never assumed from a successful
load: the suite checks every peer's logits before it times it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

import numpy as np

# model_type (after mlx_lm_view's renames) -> the mlx_lm.models module that runs it
MLX_LM_MODELS = ("rwkv7", "mamba2", "qwen3_5", "lfm2", "granitemoehybrid", "nemotron_h")
# mlx-lm's RWKV-7 g_norm eps is a constant (models/rwkv7.py); BlinkDL's, and fla's at head_dim 64
MLX_LM_RWKV7_G_NORM_EPS = 64e-5
MLX_NN_RMSNORM_EPS = 1e-5  # mlx.nn.RMSNorm's default, which mlx-lm's Mamba-2 block norm keeps


class MlxRefusal(Exception):
    """mlx-lm cannot run this model as given (the message says why); no line, the reason kept."""


def mlx_missing() -> str | None:
    """Why the mlx-lm line cannot run here, or None when mlx and mlx-lm import."""
    try:
        import mlx.core  # noqa: F401
        import mlx_lm  # noqa: F401
    except ImportError as e:
        return f"mlx / mlx-lm not importable ({e}); pip install -e '.[bench]' installs mlx[cpu] and mlx-lm"
    return None


# --------------------------------------------------------------------------------------
# Folders mlx-lm loads
# --------------------------------------------------------------------------------------


def write_rwkv7_folder(model, path: Path) -> Path:
    """An ssmport RWKV-7 model (canonical names) as the folder mlx-lm's rwkv7 loads: fla's
    tensor names and config keys (`model.layers.N.attn.*`, LoRA weights as nn.Linear), from
    ssmport's own fla name table. mlx-lm fixes the output GroupNorm's eps at 64e-5, where fla
    reads head_dim * norm_eps (the same at head_dim 64, every released RWKV-7), and always
    has layer 0's pre-norm and value = key width; other models are refused."""
    from safetensors.torch import save_file

    from ssmport.models.rwkv7.checkpoints import fla_storage

    c = model.config
    unsupported = {
        f"ln_x eps {c.ln_x_eps:g} (mlx-lm's is fixed at {MLX_LM_RWKV7_G_NORM_EPS:g})": not math.isclose(
            c.ln_x_eps, MLX_LM_RWKV7_G_NORM_EPS, rel_tol=1e-6),
        f"value head size {c.value_head_size} != head size {c.head_size}": c.v_head != c.head_size,
        "no ln0 (mlx-lm's layer 0 always has its pre-norm)": not c.has_ln0,
    }  # fmt: skip
    reasons = [why for why, applies in unsupported.items() if applies]
    if reasons:
        raise MlxRefusal(f"mlx-lm's rwkv7 cannot express this model: {', '.join(reasons)}")
    tensors = {}
    for ours, (theirs, _) in fla_storage(c, "lm_head.weight", stacked_mixes=False).items():
        t = model.weights[ours]
        if theirs.endswith((".lora.0.weight", ".lora.2.weight")):  # canonical [in, out] -> nn.Linear [out, in]
            t = t.t()
        elif ".attn.x_" in theirs:  # fla's token-shift mixes are [1, 1, C]
            t = t.reshape(1, 1, -1)
        tensors[theirs] = t.contiguous()
    config = {
        "model_type": "rwkv7", "architectures": ["RWKV7ForCausalLM"], "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size, "num_hidden_layers": c.num_layers, "head_dim": c.head_size,
        "intermediate_size": c.ffn_size, "decay_low_rank_dim": c.decay_lora, "a_low_rank_dim": c.a_lora,
        "v_low_rank_dim": c.v_lora, "gate_low_rank_dim": c.gate_lora, "hidden_act": "sqrelu", "norm_first": True,
        "norm_bias": True, "norm_eps": c.norm_eps, "tie_word_embeddings": False, "attn": None,
    }  # fmt: skip
    with _replacing(path) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(tensors, str(tmp / "model.safetensors"))
    return path


def mlx_lm_view(src: Path, dst: Path) -> Path:
    """`src`, a Hugging Face folder (config.json + model*.safetensors), as a folder mlx-lm
    loads: the same weight files (linked, not copied) and config.json in the keys mlx-lm's
    model file reads. Raises MlxRefusal when mlx-lm has no way to say this model."""
    src = Path(src).resolve()
    config = json.loads((src / "config.json").read_text())
    model_type = config.get("model_type")
    if model_type not in _CONFIG_FOR_MLX_LM:
        raise MlxRefusal(f"mlx-lm has no model for model_type {model_type!r} (it has {', '.join(MLX_LM_MODELS)})")
    _CONFIG_FOR_MLX_LM[model_type](config)
    weights = sorted(src.glob("model*.safetensors"))
    if not weights:
        raise MlxRefusal(f"{src}: no model*.safetensors")
    with _replacing(dst) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for f in weights:
            (tmp / f.name).symlink_to(f)
    return dst


def _mamba2(config: dict) -> None:
    # transformers writes an unbounded dt as {"__float__": "Infinity"}; mlx-lm clips by the numbers
    config["time_step_limit"] = [_json_float(v) for v in config.get("time_step_limit", (0.0, math.inf))]
    config.setdefault("time_step_rank", "auto")  # required by mlx-lm's ModelArgs, unused by its math
    # transformers derives it (expand * hidden_size) and does not save it; mlx-lm requires it
    config.setdefault("intermediate_size", int(config.get("expand", 2) * config["hidden_size"]))


def _json_float(v) -> float:
    return float(v["__float__"]) if isinstance(v, dict) else float(v)


def _qwen3_5(config: dict) -> None:
    """mlx-lm runs `qwen3_5` only (the text-only `qwen3_5_text` folder is the same text model)
    and places full attention by `full_attention_interval` alone, not `layer_types`."""
    if config["model_type"] == "qwen3_5_text":
        config["model_type"] = "qwen3_5"
    text = config.get("text_config", config)
    kinds = text.get("layer_types")
    if kinds is None:
        return
    full = [k == "full_attention" for k in kinds]
    every = {n: [(i + 1) % n == 0 for i in range(len(kinds))] for n in range(1, len(kinds) + 1)}
    interval = next((n for n, pattern in every.items() if pattern == full), None)
    if interval is None:
        raise MlxRefusal(f"mlx-lm's qwen3_5 puts full attention on every full_attention_interval-th layer; "
                         f"layer_types {kinds} is not such a pattern")  # fmt: skip
    text["full_attention_interval"] = interval


def _lfm2(config: dict) -> None:
    config.setdefault("block_dim", config["hidden_size"])  # mlx-lm's MLP width key (legacy LFM2 configs)


_CONFIG_FOR_MLX_LM = {
    "rwkv7": lambda config: None,
    "mamba2": _mamba2,
    "qwen3_5": _qwen3_5,
    "qwen3_5_text": _qwen3_5,
    "lfm2": _lfm2,
    "granitemoehybrid": lambda config: None,
    "nemotron_h": lambda config: None,
}


def known_differences(config: dict) -> list[str]:
    """Where mlx-lm 0.32's model file computes something other than transformers' for this
    config (read from both sources): the likely cause when its logits disagree."""
    text = config.get("text_config", config)
    kind = config.get("model_type")
    notes = []
    groups = {"mamba2": text.get("n_groups", 1), "granitemoehybrid": text.get("mamba_n_groups", 1)}.get(kind, 1)
    if groups and groups > 1:
        notes.append(f"mlx-lm's gated RMSNorm normalizes all of the mixer's channels at once; transformers "
                     f"(and mamba_ssm) normalize each of the {groups} groups on its own")  # fmt: skip
    if kind == "mamba2" and not math.isclose(text.get("layer_norm_epsilon", 1e-5), MLX_NN_RMSNORM_EPS):
        notes.append(f"mlx-lm's Mamba-2 block norm keeps eps {MLX_NN_RMSNORM_EPS:g}, not layer_norm_epsilon")
    if kind == "lfm2" and not (text.get("tie_word_embeddings", text.get("tie_embedding", True))):
        notes.append("mlx-lm's lfm2 always reads the head from the tied embedding")
    return notes


@contextmanager
def _replacing(path: Path):
    """A fresh directory that replaces `path` only once it is complete."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    yield tmp
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------
# The peer
# --------------------------------------------------------------------------------------


class MlxLmPeer:
    """mlx-lm's model for a folder on MLX's CPU device, fp32, one token per call with the
    cache mlx-lm makes for it; `step(token) -> logits`, `reset()`, `close()` (suite.Peer)."""

    def __init__(self, folder: Path):
        import mlx.core as mx
        from mlx_lm.utils import load_model

        mx.set_default_device(mx.cpu)
        folder = Path(folder)
        self.config = json.loads((folder / "config.json").read_text())
        self.known_differences = known_differences(self.config)  # kept with a refusal (suite.peer_lines)
        try:
            self.model, _ = load_model(folder, strict=True)
        # mlx-lm's strict load: ValueError for missing / extra / misshaped weights or an unknown
        # model type, TypeError for a config key its ModelArgs requires
        except (ValueError, TypeError) as e:
            raise MlxRefusal(f"mlx-lm did not load {folder.name} strictly: {' '.join(str(e).split())[:300]}") from e
        from mlx.utils import tree_flatten

        dtypes = {str(p.dtype) for _, p in tree_flatten(self.model.parameters())}
        if dtypes != {"mlx.core.float32"}:
            raise MlxRefusal(f"mlx-lm holds {folder.name}'s weights as {sorted(dtypes)}, not float32 only")
        self.name = (f"mlx-lm=={version('mlx-lm')} {self.model.model_type} on mlx=={version('mlx')} "
                     f"CPU backend, fp32, one token per call with its cache")  # fmt: skip
        self.cache = None

    def step(self, token: int) -> np.ndarray:
        import mlx.core as mx

        logits = self.model(mx.array([[token]]), cache=self.cache)
        # Evaluate the logits and every cache entry now, so a step's time is its whole work.
        mx.eval(logits, [c.state for c in self.cache])
        return np.array(logits[0, -1])

    def reset(self) -> None:
        self.cache = self.model.make_cache()

    def close(self) -> None:
        import gc

        import mlx.core as mx

        del self.model, self.cache
        gc.collect()
        mx.clear_cache()


@contextmanager
def one_cpu():
    """Every thread of this process (MLX's stream thread included) on one CPU, the lowest it
    may use now; each thread's affinity is restored after. Linux (sched_setaffinity)."""
    tasks = Path("/proc/self/task")
    before = {int(t.name): os.sched_getaffinity(int(t.name)) for t in tasks.iterdir()}
    mask = os.sched_getaffinity(0)
    cpu = min(mask)
    try:
        for tid in before:
            os.sched_setaffinity(tid, {cpu})
        yield cpu
    finally:
        for t in tasks.iterdir():  # threads started meanwhile inherited the pin: undo it too
            try:
                os.sched_setaffinity(int(t.name), before.get(int(t.name), mask))
            except OSError:  # the thread has exited
                pass
