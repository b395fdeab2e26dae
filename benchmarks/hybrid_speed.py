"""Decode and prefill speed of the hybrid exports (LFM2, Granite-4.0-H, Nemotron-H, OLMo-Hybrid,
LFM3, RecurrentGemma, Falcon-H1) against transformers' own torch path, in one run per model.

    flock /tmp/ssmport-heavy.lock python benchmarks/hybrid_speed.py --model lfm2-350m \\
        --out benchmarks/results/hybrid_speed_lfm2-350m.json

MODEL is a preset (synthetic fp32 weights from its fixed seed), or PRESET:N for its first N
layers (a model too large for this machine measured at its real widths: not a released size).
Per model, each stage runs in a child process of its own, one after another (at a released
size each holds a whole fp32 copy of the weights: Nemotron-H 4B is 16 GB, and no two fit in
24 GB at once); the results record each stage's peak RSS:

  coreai                the fp32 bundle on the Core AI runtime (single-threaded), its M=1 decode
                        timed before and after the others (the headline is their mean)
  torch_eager           ssmport's own decode module, torch eager, 1 thread and torch's default
  peer                  transformers' class (Lfm2ForCausalLM, GraniteMoeHybridForCausalLM,
                        NemotronHForCausalLM, OlmoHybridForCausalLM, FalconH1ForCausalLM,
                        Lfm2MoeForCausalLM, Qwen3_5ForCausalLM, Lfm3ForCausalLM,
                        RecurrentGemmaForCausalLM) on the
                        same weights, its pure-torch path, one token
                        per call with its cache, 1 thread and default threads; timed only after
                        it agrees with ssmport's torch module (benchmarks/suite.py's check)
  prefill               the bundle's `prefill` vs its M=1 loop on random prompts, tokens/s
                        (benchmarks/prefill_speed.py's measurement, alternating the two; a
                        bundle over a third of the machine's memory runs them one at a time)

Decode is the median ms/token over --steps tokens after --warmup. The machine is shared:
compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from importlib.metadata import version
from pathlib import Path

import numpy as np
import psutil
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import prefill_speed  # noqa: E402
import suite  # noqa: E402

from ssmport.architectures import LoadedModel  # noqa: E402
from ssmport.bench import weight_bytes_per_token  # noqa: E402
from ssmport.bundle import Bundle, dir_bytes  # noqa: E402
from ssmport.prefill import DEFAULT_CHUNK  # noqa: E402
from ssmport.loader.resolve import DEFAULT_SEED, load_model  # noqa: E402


def synthetic_model(spec: str) -> LoadedModel:
    """A preset's synthetic model, or PRESET:N: its first N layers (same widths and seed)."""
    preset, _, layers = spec.partition(":")
    model = load_model(preset, synthetic=True, seed=DEFAULT_SEED)
    if not layers:
        return model
    c, n = model.config, int(layers)
    field = "pattern" if hasattr(c, "pattern") else "layer_types"
    config = dataclasses.replace(c, **{field: getattr(c, field)[:n]})
    weights = model.architecture.synthetic_weights(config, DEFAULT_SEED)
    return dataclasses.replace(model, config=config, weights=weights, name=f"{preset}-first{n}",
                               provenance=model.provenance | {"layers": n})  # fmt: skip


# --------------------------------------------------------------------------------------
# transformers' model on ssmport's synthetic weights
# --------------------------------------------------------------------------------------


def _rope(theta: float) -> dict:
    return {"rope_type": "default", "rope_theta": theta}


def transformers_model(model: LoadedModel):
    """transformers' own class built from the config, the synthetic weights loaded strictly
    (ssmport's canonical names are transformers' in-memory ones, convs unsqueezed)."""
    import transformers

    c, arch = model.config, model.architecture.name
    if arch == "olmo_hybrid":  # ssmport's field names are transformers' own
        keys = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                "linear_conv_kernel_dim", "linear_allow_neg_eigval", "rms_norm_eps", "attention_bias")  # fmt: skip
        config = transformers.OlmoHybridConfig(
            **{k: getattr(c, k) for k in keys}, num_hidden_layers=c.num_layers, layer_types=list(c.layer_types),
            rope_parameters=_rope(c.rope_theta), tie_word_embeddings=False, max_position_embeddings=max(4096, c.context),
            pad_token_id=0)  # fmt: skip
        return _load_peer(model, "OlmoHybridForCausalLM", config, {})
    if arch == "qwen3_5":  # benchmarks/qwen35_bench.py's peer (its own field names)
        import qwen35_bench

        return qwen35_bench.transformers_model(model), f"transformers=={version('transformers')} Qwen3_5ForCausalLM torch path, cpu fp32, use_cache"
    common = {"vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "num_attention_heads": c.num_heads,
              "num_key_value_heads": c.num_kv_heads, "tie_word_embeddings": False,
              "max_position_embeddings": max(4096, getattr(c, "context", 0))}  # fmt: skip
    if arch == "lfm2":
        cls, config = "Lfm2ForCausalLM", transformers.Lfm2Config(
            **common, num_hidden_layers=c.num_layers, layer_types=list(c.layer_types), intermediate_size=c.intermediate_size,
            block_auto_adjust_ff_dim=False, conv_L_cache=c.conv_kernel, conv_bias=c.conv_bias, norm_eps=c.norm_eps,
            rope_parameters=_rope(c.rope_theta))  # fmt: skip
        rename = {}
    elif arch == "granitemoehybrid":
        cls, config = "GraniteMoeHybridForCausalLM", transformers.GraniteMoeHybridConfig(
            **common, num_hidden_layers=c.num_layers, layer_types=list(c.layer_types), num_local_experts=0,
            num_experts_per_tok=0, shared_intermediate_size=c.intermediate_size, intermediate_size=c.intermediate_size,
            mamba_n_heads=c.mamba_heads, mamba_d_head=c.mamba_head_dim, mamba_n_groups=c.n_groups,
            mamba_d_state=c.state_size, mamba_d_conv=c.conv_kernel, mamba_expand=c.mixer.intermediate_size // c.hidden_size,
            mamba_conv_bias=c.conv_bias, mamba_proj_bias=c.proj_bias, attention_bias=c.attention_bias,
            position_embedding_type=c.position_embedding, rope_parameters=_rope(c.rope_theta), rms_norm_eps=c.norm_eps,
            embedding_multiplier=c.embedding_multiplier, residual_multiplier=c.residual_multiplier,
            attention_multiplier=c.attention_multiplier, logits_scaling=c.logits_scaling)  # fmt: skip
        rename = {}
    elif arch == "nemotron_h":
        cls, config = "NemotronHForCausalLM", transformers.NemotronHConfig(
            **common, hybrid_override_pattern=c.pattern, head_dim=c.head_dim, intermediate_size=c.intermediate_size,
            mamba_num_heads=c.mamba_heads, mamba_head_dim=c.mamba_head_dim, n_groups=c.n_groups,
            ssm_state_size=c.state_size, conv_kernel=c.conv_kernel, use_conv_bias=c.conv_bias,
            layer_norm_epsilon=c.norm_eps)  # fmt: skip
        rename = {n: "model." + n for n in model.weights if n != "lm_head.weight"}
    elif arch == "falcon_h1":
        cls, config = "FalconH1ForCausalLM", transformers.FalconH1Config(
            **common, num_hidden_layers=c.num_layers, head_dim=c.head_dim, intermediate_size=c.intermediate_size,
            mamba_n_heads=c.mamba_heads, mamba_d_head=c.mamba_head_dim, mamba_d_ssm=c.mixer.intermediate_size,
            mamba_n_groups=c.n_groups, mamba_d_state=c.state_size, mamba_d_conv=c.conv_kernel,
            mamba_conv_bias=c.conv_bias, mamba_proj_bias=c.proj_bias, projectors_bias=c.proj_bias,
            attention_bias=c.attention_bias, mamba_rms_norm=c.gated_norm != "none",
            mamba_norm_before_gate=c.gated_norm == "norm_first", rope_parameters=_rope(c.rope_theta),
            rms_norm_eps=c.norm_eps, embedding_multiplier=c.embedding_multiplier, lm_head_multiplier=c.lm_head_multiplier,
            attention_in_multiplier=c.attention_in_multiplier, attention_out_multiplier=c.attention_out_multiplier,
            key_multiplier=c.key_multiplier, ssm_in_multiplier=c.ssm_in_multiplier, ssm_out_multiplier=c.ssm_out_multiplier,
            mlp_multipliers=list(c.mlp_multipliers), ssm_multipliers=list(c.ssm_multipliers))  # fmt: skip
        rename = {}
    elif arch == "lfm2_moe":
        cls, config = "Lfm2MoeForCausalLM", transformers.Lfm2MoeConfig(
            **common, num_hidden_layers=c.num_layers, layer_types=list(c.layer_types), intermediate_size=c.intermediate_size,
            moe_intermediate_size=c.moe_intermediate_size, num_dense_layers=c.num_dense_layers, num_experts=c.num_experts,
            num_experts_per_tok=c.num_experts_per_tok, use_expert_bias=c.use_expert_bias, norm_topk_prob=c.norm_topk_prob,
            routed_scaling_factor=c.routed_scaling_factor, conv_L_cache=c.conv_kernel, conv_bias=c.conv_bias,
            norm_eps=c.norm_eps, rope_parameters=_rope(c.rope_theta))  # fmt: skip
        return _load_peer_stacked(model, cls, config, "pos_emb")
    elif arch == "lfm3":
        # Every rope kind as "proportional": with partial_rotary_factor 1 it is "default" (ssmport's config keeps the fraction).
        rope = {kind: {"rope_type": "proportional", "rope_theta": theta, "partial_rotary_factor": fraction}
                for kind, theta, fraction in (("full_attention", c.full_rope_theta, c.full_rope_fraction),
                                              ("sliding_attention", c.sliding_rope_theta, c.sliding_rope_fraction))}  # fmt: skip
        cls, config = "Lfm3ForCausalLM", transformers.Lfm3Config(
            **common, head_dim=c.head_dim, num_hidden_layers=c.num_layers, layer_types=list(c.layer_types),
            intermediate_size=c.intermediate_size, sliding_window=c.sliding_window, conv_L_cache=c.conv_kernel,
            conv_bias=c.conv_bias, attention_bias=c.attention_bias, use_attention_gate=c.attention_gate,
            use_sandwich_norm=c.sandwich_norm, norm_eps=c.norm_eps, rope_parameters=rope, pad_token_id=0)  # fmt: skip
        rename = {n: n.replace("self_attn.gate_proj.", "self_attn.g_proj.") for n in model.weights}  # its in-memory name
    elif arch == "recurrent_gemma":
        cls, config = "RecurrentGemmaForCausalLM", transformers.RecurrentGemmaConfig(
            **common, num_hidden_layers=c.num_layers, block_types=list(c.layer_types), lru_width=c.lru_width,
            intermediate_size=2 * c.intermediate_size, attention_window_size=c.window, conv1d_width=c.conv_width,
            logits_soft_cap=c.logits_soft_cap, rms_norm_eps=c.norm_eps, attention_bias=c.attention_bias,
            rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta, "partial_rotary_factor": c.partial_rotary_factor},
            pad_token_id=0)  # fmt: skip
        rename = {}
    else:
        raise SystemExit(f"no transformers peer for {arch}")
    return _load_peer(model, cls, config, rename)


def _load_peer_stacked(model: LoadedModel, cls: str, config, rotary: str):
    """transformers' class built on the meta device and given ssmport's tensors (no random
    init, no second copy of the dense weights: a released MoE is 33 GB in fp32), its fused
    expert stacks assembled from ssmport's per-expert tensors: `gate_up_proj` [E, 2F, C] is
    each expert's w1 (gate) over its w3 (up), `down_proj` [E, C, F] its w2. Every ssmport
    tensor must be used and every transformers one given; `rotary` names the rotary module,
    whose buffers are computed again off the meta device."""
    import transformers

    with torch.device("meta"):
        hf = getattr(transformers, cls)(config)
    w, state, used = model.weights, {}, set()
    for theirs, like in hf.state_dict().items():
        prefix, _, kind = theirs.rpartition("experts.")
        if kind in ("gate_up_proj", "down_proj"):
            parts = ("w1", "w3") if kind == "gate_up_proj" else ("w2",)
            names = [[f"{prefix}experts.{e}.{part}.weight" for part in parts] for e in range(like.shape[0])]
            state[theirs] = torch.stack([torch.cat([w[n] for n in expert]) for expert in names])
            used.update(n for expert in names for n in expert)
        else:
            state[theirs] = w[theirs].reshape(like.shape)  # conv: [C, K] -> [C, 1, K]
            used.add(theirs)
    if used != set(w):
        raise SystemExit(f"transformers peer: names differ: {sorted(used ^ set(w))[:6]}")
    hf.load_state_dict(state, strict=True, assign=True)
    module = hf.model.get_submodule(rotary)
    hf.model.set_submodule(rotary, type(module)(hf.config))
    meta = [n for n, t in [*hf.named_parameters(), *hf.named_buffers()] if t.is_meta]
    if meta:
        raise SystemExit(f"transformers peer: left on the meta device: {meta[:6]}")
    return hf.eval(), f"transformers=={version('transformers')} {cls} torch path, cpu fp32, use_cache"


def _load_peer(model: LoadedModel, cls: str, config, rename: dict[str, str]):
    import transformers

    hf = getattr(transformers, cls)(config)  # (on the CPU: its rotary tables are computed at init)
    own = hf.state_dict(keep_vars=True)
    names = {rename.get(n, n): n for n in model.weights}
    if set(names) != set(own):
        raise SystemExit(f"transformers peer: names differ: {sorted(set(names) ^ set(own))[:6]}")
    with torch.no_grad():
        for theirs, ours in names.items():  # one tensor at a time: no second copy of the model
            own[theirs].copy_(model.weights[ours].reshape(own[theirs].shape))  # conv: [C, K] -> [C, 1, K]
    return hf.eval(), f"transformers=={version('transformers')} {cls} torch path, cpu fp32, use_cache"


class TransformersHybridPeer(suite.Peer):
    def __init__(self, model: LoadedModel):
        from transformers.integrations import hub_kernels

        if hub_kernels.is_kernels_available():
            raise SystemExit("transformers peer: the `kernels` hub package is installed")
        for package in ("causal_conv1d", "mamba_ssm", "flash_attn", "fla"):
            if importlib.util.find_spec(package) is not None:
                raise SystemExit(f"transformers peer: `{package}` is installed, so the torch path may not run")
        self.model, self.name = transformers_model(model)
        self.torch_path = "no kernels / causal_conv1d / mamba_ssm / flash_attn / fla installed"
        self.cache = None

    def step(self, token: int) -> np.ndarray:
        with torch.no_grad():
            out = self.model(torch.tensor([[token]]), past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
        return out.logits[0, -1].float().numpy()

    def reset(self) -> None:
        self.cache = None

    def close(self) -> None:
        del self.model, self.cache
        super().close()


class TransformersRecurrentGemmaPeer(TransformersHybridPeer):
    """RecurrentGemmaForCausalLM keeps its RG-LRU and conv states in its modules and returns no
    cache: each sequence starts with `_setup_cache` and a cache of our own, which its local
    attention fills (with none given it would start a new sequence on every call). Its cached
    path is only right where lru_width == hidden_size (tests/recurrent_gemma_files.py), as in
    every release."""

    def __init__(self, model: LoadedModel):
        if model.config.lru_width != model.config.hidden_size:
            raise suite.PeerRefusal(f"transformers' cached RecurrentGemma path needs lru_width == hidden_size "
                                    f"(this model: {model.config.lru_width} != {model.config.hidden_size})")  # fmt: skip
        super().__init__(model)

    def step(self, token: int) -> np.ndarray:
        from transformers import DynamicCache

        with torch.no_grad():
            if self.cache is None:
                self.model.model._setup_cache(self.model.config, 1, torch.device("cpu"), torch.float32)
                self.cache = DynamicCache(config=self.model.config)
            out = self.model(torch.tensor([[token]]), cache=self.cache, use_cache=True)
        return out.logits[0, -1].float().numpy()


def open_peer(model: LoadedModel) -> TransformersHybridPeer:
    """The transformers peer of a hybrid preset's model."""
    peer = TransformersRecurrentGemmaPeer if model.architecture.name == "recurrent_gemma" else TransformersHybridPeer
    return peer(model)


# --------------------------------------------------------------------------------------


def export_bundle(spec: str, out: Path, chunk: int, quant: str = "fp32", gate_steps: int = 8,
                  experts: str = "gathered") -> Path:  # fmt: skip
    """Export in this process: synthetic weights (fp32 unless `quant` says) with prefill; a MoE
    model's decode reading its experts in the `experts` form (export --experts); no gate where
    `gate_steps` is 0 (a model whose fp32 reference does not fit beside the export)."""
    from ssmport.exporter.pipeline import export

    return export(synthetic_model(spec), out, quant=quant, gate=gate_steps > 0, gate_steps=gate_steps,
                  prefill_chunk=chunk, progress=False, overwrite=True, experts=experts).path  # fmt: skip


def torch_eager_lines(model: LoadedModel, tokens: list[int], warmup: int) -> tuple[dict, np.ndarray]:
    from ssmport.gate.torch_runner import TorchRunner

    ref = TorchRunner(model, "fp32")
    try:
        ref.reset()
        check = ref.step_each(tokens[: suite.PEER_CHECK_TOKENS])
        return suite.thread_lines("torch_eager", ref.step, ref.reset, tokens, warmup), check
    finally:
        ref.close()


def _bundle(work: Path) -> Bundle:
    return Bundle.open(next(p for p in (work / "bundles").iterdir() if (p / "manifest.json").is_file()))


def _check_logits_path(work: Path) -> Path:
    return work / "torch_eager_check_logits.npy"


def stage(name: str, spec: str, work: Path, a: argparse.Namespace) -> dict:
    """One stage of a model's run, in a process of its own (the child's entry point): at a
    released size each holds a whole fp32 copy of the weights, and no two fit at once."""
    if name == "export":
        export_bundle(spec, work / "bundles", a.chunk, a.quant, a.gate_steps, a.experts)
        return {}
    bundle = _bundle(work)
    tokens = suite.bench_tokens(bundle.manifest.vocab_size, a.steps + a.warmup)
    if name in ("coreai", "coreai_again"):
        return {"times_ms": suite.coreai_line(bundle, tokens, a.warmup)}
    model = synthetic_model(spec)
    if name == "torch_eager":
        lines, check = torch_eager_lines(model, tokens, a.warmup)
        np.save(_check_logits_path(work), check)
        return {"lines": lines}
    if name == "peer":
        peer = open_peer(model)
        try:
            lines, record = suite.peer_lines(peer, np.load(_check_logits_path(work)), tokens, a.warmup)
        finally:
            peer.close()
        return {"lines": lines, "peer": record}
    raise SystemExit(f"unknown stage {name}")


def run_stage(name: str, spec: str, work: Path, a: argparse.Namespace) -> dict:
    """`stage` in a child process; its result, with the child's peak RSS and wall seconds. With
    --keep, a stage whose result is already in the model's directory is not run again."""
    result = work / f"stage-{name}.json"
    if a.keep and result.is_file():
        print(f"[{spec}] {name}: kept from an earlier run", flush=True)
        return json.loads(result.read_text())
    argv = [sys.executable, __file__, "--stage", name, spec, "--work", str(work), "--chunk", str(a.chunk),
            "--steps", str(a.steps), "--warmup", str(a.warmup), "--quant", a.quant, "--gate-steps", str(a.gate_steps), "--experts", a.experts]
    argv += ["--one-thread"] if a.one_thread else []  # fmt: skip
    print(f"[{spec}] {name}", flush=True)
    start = time.perf_counter()
    done = subprocess.run(argv, check=False)
    if done.returncode:
        raise SystemExit(f"{name} stage of {spec} failed (exit {done.returncode})")
    record = json.loads(result.read_text()) | {"wall_s": round(time.perf_counter() - start, 1)}
    result.write_text(json.dumps(record))
    return record


def run(spec: str, work: Path, a: argparse.Namespace) -> dict:
    exported = run_stage("export", spec, work, a)
    bundle = _bundle(work)
    first = run_stage("coreai", spec, work, a)
    eager = run_stage("torch_eager", spec, work, a)
    peer = run_stage("peer", spec, work, a)
    last = run_stage("coreai_again", spec, work, a)
    first_ms, last_ms = float(np.median(first["times_ms"])), float(np.median(last["times_ms"]))
    lines = {"coreai": {"ms_per_token": (first_ms + last_ms) / 2, "first_pass_ms": first_ms, "last_pass_ms": last_ms,
                        "samples": 2 * a.steps}} | eager["lines"] | peer["lines"]  # fmt: skip
    ours = lines["coreai"]["ms_per_token"]
    for name, line in lines.items():
        print(f"  {name:20} {line['ms_per_token']:9.2f} ms/token" + (f"   (Core AI / this: {ours / line['ms_per_token']:.2f})"
              if name != "coreai" else ""), flush=True)  # fmt: skip
    # Two runners at once hold the bundle twice: past a third of this machine's memory, one at a time.
    together = 3 * dir_bytes(bundle.path) < psutil.virtual_memory().total
    m = bundle.manifest
    stages = (("export", exported), ("coreai", first), ("torch_eager", eager), ("peer", peer), ("coreai_again", last))
    record = {"model": spec, "bundle": bundle.path.name, "architecture": m.architecture, "quant": a.quant,
              "experts": m.export.get("experts", "gathered"), "config": m.config,
              "asset_bytes": dir_bytes(bundle.path), "weight_bytes_per_token": weight_bytes_per_token(m),
              "weight_bytes_total": sum(e["bytes"] for e in m.plan_tensors),
              "stage_peak_rss_gb": {name: r["peak_rss_gb"] for name, r in stages},
              "stage_wall_s": {name: r.get("wall_s") for name, r in stages}}  # fmt: skip
    if not a.prompts:
        print(f"[{spec}] prefill not measured (no --prompts)", flush=True)
        prefill, recurrence = None, None
    else:
        print(f"[{spec}] prefill vs the M=1 loop (chunk {a.chunk}, runners {'together' if together else 'one at a time'})",
              flush=True)  # fmt: skip
        prefill, recurrence = prefill_speed.measure(bundle.path, a.prompts, a.repeats, seed=0, together=together)
    return record | {
            "gate": {k: getattr(m.gate, k, None) for k in ("passed", "top1_agree", "steps", "max_rel_logit_delta")},
            "states": [s.key for s in m.states], "runtime_ops": m.export.get("runtime_ops"), "lines": lines, "peer": peer["peer"],
            "ratios": {f"coreai/{k}": ours / v["ms_per_token"] for k, v in lines.items() if k != "coreai"},
            "prefill": {"chunk": a.chunk, "runners_together": together, "runs": prefill, "recurrence": recurrence}}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", help="PRESET or PRESET:N (first N layers); repeatable")
    p.add_argument("--steps", type=int, default=32, help="timed tokens per decode line (default 32)")
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help=f"prefill chunk (default {DEFAULT_CHUNK})")
    p.add_argument("--prompts", nargs="*", type=int, default=[64, 512], help="prefill prompt lengths (none: no prefill line)")
    p.add_argument("--quant", default="fp32", help="the bundle's recipe (default fp32)")
    p.add_argument("--gate-steps", type=int, default=8, help="tokens in the export's gate (default 8; 0: no gate)")
    p.add_argument("--experts", choices=["gathered", "branched"], default="gathered",
                   help="MoE models: the decode graph's expert form (export --experts; default gathered)")
    p.add_argument("--one-thread", action="store_true", help="time torch and the peer at 1 thread only (no default-threads line)")
    p.add_argument("--keep", action="store_true",
                   help="work in --work/MODEL and keep it: a rerun reuses the bundle and every finished stage")  # fmt: skip
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--work", type=Path, help="where the bundle is written (default: a temporary directory)")
    p.add_argument("--out", type=Path, help="results JSON")
    p.add_argument("--stage", nargs=2, metavar=("STAGE", "MODEL"), help=argparse.SUPPRESS)  # a child process
    a = p.parse_args()
    suite.ONE_THREAD_ONLY = a.one_thread
    if a.stage:
        name, spec = a.stage
        result = stage(name, spec, a.work, a)
        peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
        (a.work / f"stage-{name}.json").write_text(json.dumps(result | {"peak_rss_gb": peak_gb}))
        return
    if not a.model:
        p.error("give at least one --model")
    results = {"command": " ".join(sys.argv), "machine": suite.machine(), "steps": a.steps, "warmup": a.warmup,
               "models": []}  # fmt: skip
    suite.ONE_THREAD_ONLY = a.one_thread
    for spec in a.model:
        if a.keep:
            if a.work is None:
                p.error("--keep needs --work")
            keep = a.work / spec.replace(":", "-")
            keep.mkdir(parents=True, exist_ok=True)
            context = nullcontext(str(keep))
        else:
            if a.work is not None:
                a.work.mkdir(parents=True, exist_ok=True)
            context = tempfile.TemporaryDirectory(prefix="hybrid-speed-", dir=a.work)
        with context as tmp:
            if not (a.keep and "SSMPORT_CACHE" in os.environ):  # --keep: a lowered copy elsewhere may stay there
                os.environ["SSMPORT_CACHE"] = str(Path(tmp) / "cache")  # the lowered copy goes with the bundle
            results["models"].append(run(spec, Path(tmp), a))
            text = json.dumps(results, indent=2)
            if a.out:  # after each model: a later one running out of memory keeps the earlier
                a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
