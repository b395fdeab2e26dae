"""xLSTM (mLSTM blocks, the "xLSTM-7B" layout) as an ssmport architecture, from outside ssmport.

This one file is everything ssmport needs to export, gate and run an architecture it does
not ship; docs/adding-an-architecture.md walks through it. Run it:

    python examples/xlstm.py --out out/        # writes a tiny checkpoint (fixed seed), exports
                                               # it, gates it on Core AI, generates
    ssmport --plugin examples/xlstm.py export out/xlstm-tiny-checkpoint -o out/   # int8keepproj
    ssmport --plugin examples/xlstm.py gate out/xlstm-tiny-checkpoint-int8keepproj

The model (Beck et al. 2024, "xLSTM"; the 7B layout of Beck et al. 2025), per block:

    x += out_proj( sigmoid(o) * headnorm( mLSTM(q, k, v, i, f) ) )      after an RMSNorm
    x += down( silu(up_gate(x)) * up(x) )                                after an RMSNorm

and the mLSTM cell, per head, with exponential input gate i, sigmoid forget gate f
(both pre-activations soft-capped at 15) and the running log-scale m that keeps exp() finite:

    m' = max(log f + m, i)          f' = exp(log f + m - m')        i' = exp(i - m')
    C' = f' C + i' k v^T            n' = f' n + i' k                 (C: [dk, dv], n: [dk])
    h  = C'^T q~ / (max(|n'^T q~|, exp(-m')) + eps)                  q~ = q / sqrt(dk)

Zero-initialised C, n, m are exact (C and n carry the factor exp(-m) that h divides out), so
the runner's zeroed states are the right start. Logits are soft-capped at 30.

The checkpoint layout is Hugging Face's `xLSTMForCausalLM` (config.json + safetensors,
`weight_mode="single"`); the tests compare this file's exported bundle with transformers'
own implementation on the checkpoint written here.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import ssmport
from ssmport.loader.checkpoint import DictSource, MappedSource, TensorSource, check_strict
from ssmport.errors import CheckpointError
from ssmport.graph import Embedding, NormHead
from ssmport.ops.norms import rms_norm
from ssmport.state import StateSpec


@dataclass(frozen=True)
class XLSTMConfig:
    vocab_size: int
    hidden_size: int  # C
    num_layers: int  # L
    num_heads: int  # H
    qk_dim: int  # H * dk
    v_dim: int  # H * dv
    ffn_size: int
    norm_eps: float = 1e-6
    cell_eps: float = 1e-6  # the + eps in the cell's denominator
    gate_soft_cap: float = 15.0
    logit_soft_cap: float = 30.0

    @property
    def dk(self) -> int:
        return self.qk_dim // self.num_heads

    @property
    def dv(self) -> int:
        return self.v_dim // self.num_heads

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _round_up(x: float, multiple: int) -> int:
    return int(math.ceil(x / multiple) * multiple)


def config_from_hf(cj: Mapping[str, Any], origin: str) -> XLSTMConfig:
    """Our config from transformers' `xLSTMConfig` JSON; options we do not implement are refused."""
    unsupported = {"weight_mode": "single", "use_bias": False, "add_out_norm": True, "tie_word_embeddings": False}
    for key, ours in unsupported.items():
        if cj.get(key, ours) != ours:
            raise CheckpointError(f"{origin}: xLSTM with {key}={cj[key]!r} is not supported (only {ours!r})")
    try:
        width = int(cj.get("hidden_size") or cj["embedding_dim"])
        heads = int(cj["num_heads"])
        config = XLSTMConfig(
            vocab_size=int(cj["vocab_size"]),
            hidden_size=width,
            num_layers=int(cj.get("num_hidden_layers") or cj["num_blocks"]),
            num_heads=heads,
            qk_dim=int(width * float(cj.get("qk_dim_factor", 0.5))),  # as xLSTMLayer sizes it
            v_dim=int(width * float(cj.get("v_dim_factor", 1.0))),
            ffn_size=_round_up(
                width * float(cj.get("ffn_proj_factor", 2.667)), int(cj.get("ffn_round_up_to_multiple_of", 64))
            ),
            norm_eps=float(cj.get("norm_eps", 1e-6)),
            cell_eps=float(cj.get("eps", 1e-6)),
            gate_soft_cap=float(cj.get("gate_soft_cap", 15.0)),
            logit_soft_cap=float(cj.get("output_logit_soft_cap", 30.0)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{origin}: config.json lacks a valid {exc}") from None
    if config.qk_dim % heads or config.v_dim % heads:
        raise CheckpointError(f"{origin}: qk_dim {config.qk_dim} / v_dim {config.v_dim} not divisible by {heads} heads")
    return config


# --------------------------------------------------------------------------------------
# Canonical weights and the Hugging Face key mapping. Canonical matmul weights are [out, in].
# --------------------------------------------------------------------------------------

LAYER_WEIGHTS = {  # canonical leaf -> xLSTMForCausalLM name inside backbone.blocks.{i}.
    "norm_mlstm": "norm_mlstm.weight", "q": "mlstm_layer.q.weight", "k": "mlstm_layer.k.weight",
    "v": "mlstm_layer.v.weight", "o_gate": "mlstm_layer.ogate_preact.weight",
    "i_gate": "mlstm_layer.igate_preact.weight", "i_bias": "mlstm_layer.igate_preact.bias",
    "f_gate": "mlstm_layer.fgate_preact.weight", "f_bias": "mlstm_layer.fgate_preact.bias",
    "head_norm": "mlstm_layer.multihead_norm.weight", "out": "mlstm_layer.out_proj.weight",
    "norm_ffn": "norm_ffn.weight", "up_gate": "ffn.proj_up_gate.weight", "up": "ffn.proj_up.weight",
    "down": "ffn.proj_down.weight",
}  # fmt: skip
GLOBAL_WEIGHTS = {"emb": "backbone.embeddings.weight", "out_norm": "backbone.out_norm.weight", "head": "lm_head.weight"}

# Projections into the recurrence (and the embedding, norms, biases) stay float under int8keepproj.
FLOAT_LEAVES = frozenset({"q", "k", "v", "i_gate", "f_gate", "emb", "norm_mlstm", "norm_ffn", "head_norm", "out_norm"})


def canonical_shapes(c: XLSTMConfig) -> dict[str, tuple[int, ...]]:
    C, H = c.hidden_size, c.num_heads
    shapes: dict[str, tuple[int, ...]] = {"emb": (c.vocab_size, C)}
    for i in range(c.num_layers):
        leaf = {"norm_mlstm": (C,), "q": (c.qk_dim, C), "k": (c.qk_dim, C), "v": (c.v_dim, C),
                "o_gate": (c.v_dim, C), "i_gate": (H, C), "i_bias": (H,), "f_gate": (H, C), "f_bias": (H,),
                "head_norm": (c.v_dim,), "out": (C, c.v_dim), "norm_ffn": (C,),
                "up_gate": (c.ffn_size, C), "up": (c.ffn_size, C), "down": (C, c.ffn_size)}  # fmt: skip
        shapes |= {f"blocks.{i}.{k}": s for k, s in leaf.items()}
    return shapes | {"out_norm": (C,), "head": (c.vocab_size, C)}


def hf_names(c: XLSTMConfig) -> dict[str, str]:
    """canonical name -> xLSTMForCausalLM name."""
    names = dict(GLOBAL_WEIGHTS)
    for i in range(c.num_layers):
        names |= {f"blocks.{i}.{k}": f"backbone.blocks.{i}.{v}" for k, v in LAYER_WEIGHTS.items()}
    return names


def _float(t: torch.Tensor) -> torch.Tensor:
    return t.float()


# --------------------------------------------------------------------------------------
# The reference step: plain fp32, one head at a time, written for reading.
# --------------------------------------------------------------------------------------


def soft_cap(x: torch.Tensor, cap: float) -> torch.Tensor:
    return cap * torch.tanh(x / cap)


def mlstm_cell(C, n, m, q, k, v, i_pre, f_pre, eps):
    """One stabilised mLSTM step of one head: C [dk, dv], n [dk], m scalar, q/k [dk], v [dv]."""
    log_f = F.logsigmoid(f_pre)
    m_new = torch.maximum(log_f + m, i_pre)
    f_act, i_act = torch.exp(log_f + m - m_new), torch.exp(i_pre - m_new)
    C = f_act * C + i_act * torch.outer(k, v)
    n = f_act * n + i_act * k
    q = q / math.sqrt(q.numel())
    h = (q @ C) / (torch.maximum((q @ n).abs(), torch.exp(-m_new)) + eps)
    return h, C, n, m_new


class XLSTMReference:
    def __init__(self, c: XLSTMConfig, weights: TensorSource):
        self.c = c
        self.w = {name: weights[name].float() for name in canonical_shapes(c)}

    def zero_state(self) -> list[dict[str, torch.Tensor]]:
        c = self.c
        return [{"C": torch.zeros(c.num_heads, c.dk, c.dv), "n": torch.zeros(c.num_heads, c.dk),
                 "m": torch.zeros(c.num_heads)} for _ in range(c.num_layers)]  # fmt: skip

    def step(self, token: int, state: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        c, w = self.c, self.w
        x = w["emb"][token]
        for i, s in enumerate(state):
            p = f"blocks.{i}."
            h_in = rms_norm(x, w[p + "norm_mlstm"], c.norm_eps)
            q, k, v = w[p + "q"] @ h_in, w[p + "k"] @ h_in, w[p + "v"] @ h_in
            i_pre = soft_cap(w[p + "i_gate"] @ h_in + w[p + "i_bias"], c.gate_soft_cap)
            f_pre = soft_cap(w[p + "f_gate"] @ h_in + w[p + "f_bias"], c.gate_soft_cap)
            heads = []
            for h in range(c.num_heads):
                qk, vs = slice(h * c.dk, (h + 1) * c.dk), slice(h * c.dv, (h + 1) * c.dv)
                out, s["C"][h], s["n"][h], s["m"][h] = mlstm_cell(
                    s["C"][h], s["n"][h], s["m"][h], q[qk], k[qk], v[vs], i_pre[h], f_pre[h], c.cell_eps
                )
                heads.append(F.layer_norm(out, (c.dv,), eps=c.norm_eps))  # per-head LayerNorm, no affine
            y = torch.cat(heads) * w[p + "head_norm"] * torch.sigmoid(w[p + "o_gate"] @ h_in)
            x = x + w[p + "out"] @ y
            h_ffn = rms_norm(x, w[p + "norm_ffn"], c.norm_eps)
            x = x + w[p + "down"] @ (F.silu(w[p + "up_gate"] @ h_ffn) * (w[p + "up"] @ h_ffn))
        x = rms_norm(x, w["out_norm"], c.norm_eps)
        return soft_cap(w["head"] @ x, c.logit_soft_cap)


# --------------------------------------------------------------------------------------
# The export form: one block per layer on ssmport's generic graph (ssmport.graph), which
# reads each layer's state slices and writes every state once per call.
# --------------------------------------------------------------------------------------


class XLSTMBlock(nn.Module):
    """One mLSTM block + its FFN, all heads at once. States: C [H, dk, dv], n [H, dk], m [H]."""

    states = ("cState", "nState", "mState")

    def __init__(self, c: XLSTMConfig, i: int, src: TensorSource, b):
        super().__init__()
        self.c, p = c, f"blocks.{i}."
        mm = lambda n, role: b.matmul(p + n, src[p + n].t(), role)  # noqa: E731  (stored [in, out])
        vec = lambda n, role: b.vector(p + n, src[p + n], role)  # noqa: E731
        self.norm_mlstm, self.norm_ffn, self.head_norm = (vec(n, "norm") for n in ("norm_mlstm", "norm_ffn", "head_norm"))
        self.q, self.k, self.v = (mm(n, "state_proj") for n in ("q", "k", "v"))
        self.i_gate, self.f_gate = mm("i_gate", "gate"), mm("f_gate", "gate")
        self.i_bias, self.f_bias = vec("i_bias", "gate"), vec("f_bias", "gate")
        self.o_gate, self.out = mm("o_gate", "out_gate"), mm("out", "out_proj")
        self.up_gate, self.up, self.down = (mm(n, "ffn") for n in ("up_gate", "up", "down"))

    def forward(self, x: torch.Tensor, slices: dict, step) -> tuple[torch.Tensor, dict]:
        if not step.decode:
            raise NotImplementedError("xLSTM is decode-only here (build_prefill returns None)")
        c = self.c
        H, dk, dv = c.num_heads, c.dk, c.dv
        C, n, m = slices["cState"].float(), slices["nState"].float().view(H, dk, 1), slices["mState"].float().view(H, 1, 1)
        h_in = rms_norm(x, self.norm_mlstm, c.norm_eps)
        q = self.q(h_in).view(H, 1, dk) / math.sqrt(dk)
        k, v = self.k(h_in).view(H, dk, 1), self.v(h_in).view(H, 1, dv)
        i_pre = soft_cap(self.i_gate(h_in) + self.i_bias, c.gate_soft_cap).view(H, 1, 1)
        log_f = F.logsigmoid(soft_cap(self.f_gate(h_in) + self.f_bias, c.gate_soft_cap)).view(H, 1, 1)
        m_new = torch.maximum(log_f + m, i_pre)
        f_act, i_act = torch.exp(log_f + m - m_new), torch.exp(i_pre - m_new)
        C = f_act * C + i_act * (k * v)  # k v^T per head
        n = f_act * n + i_act * k
        num = (q @ C).view(H, dv)
        den = torch.maximum((q @ n).abs(), torch.exp(-m_new)).view(H, 1) + c.cell_eps
        y = F.layer_norm(num / den, (dv,), eps=c.norm_eps).view(1, H * dv)
        x = x + self.out(y * self.head_norm * torch.sigmoid(self.o_gate(h_in)))
        h_ffn = rms_norm(x, self.norm_ffn, c.norm_eps)
        x = x + self.down(F.silu(self.up_gate(h_ffn)) * self.up(h_ffn))
        return x, {"cState": C, "nState": n, "mState": m_new}


class SoftCapHead(nn.Module):
    """The final norm and head in fp32, the logit soft cap, then the recipe's logits dtype."""

    def __init__(self, head: nn.Module, cap: float, dtype: torch.dtype):
        super().__init__()
        self.head, self.cap, self.dtype = head, cap, dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return soft_cap(self.head(x), self.cap).to(self.dtype)


# --------------------------------------------------------------------------------------
# The architecture: what ssmport calls.
# --------------------------------------------------------------------------------------


class _XLSTM(ssmport.Architecture):
    def config_from_json(self, data: Mapping[str, Any]) -> XLSTMConfig:
        return XLSTMConfig(**data)

    def load_hf(self, config_json, source):
        c = config_from_hf(config_json, source.origin)
        names = hf_names(c)
        shapes = canonical_shapes(c)
        expected = {names[k]: s for k, s in shapes.items()}
        check_strict(source, expected, what=f"xLSTM (L={c.num_layers} C={c.hidden_size})")
        return c, MappedSource(source, {k: (hf, _float) for k, hf in names.items()}, shapes)

    def synthetic_weights(self, c: XLSTMConfig, seed: int) -> TensorSource:
        g = torch.Generator().manual_seed(seed)
        tensors = {}
        for name, shape in canonical_shapes(c).items():
            leaf = name.rsplit(".", 1)[-1]
            r = torch.randn(shape, generator=g)
            if leaf.startswith("norm") or leaf.endswith("norm"):
                tensors[name] = 1.0 + 0.1 * r
            elif leaf == "i_bias":  # xLSTM initialises the input gate low...
                tensors[name] = -3.0 + 0.5 * r
            elif leaf == "f_bias":  # ...and the forget gate open
                tensors[name] = torch.linspace(3.0, 6.0, shape[0]) + 0.1 * r
            elif leaf == "emb":
                tensors[name] = r
            else:
                tensors[name] = r / math.sqrt(shape[1]) * (2.0 if leaf == "head" else 1.0)
        return DictSource(tensors, origin=f"<synthetic xlstm seed {seed}>")

    def state_specs(self, c: XLSTMConfig, state_dtype: torch.dtype) -> list[StateSpec]:
        L, H = c.num_layers, c.num_heads
        return [
            StateSpec("cState", (L, 1, H, c.dk, c.dv), state_dtype, "[layer, batch, head, key, value] matrix memory C"),
            StateSpec("nState", (L, 1, H, c.dk), state_dtype, "[layer, batch, head, key] normaliser n"),
            StateSpec("mState", (L, 1, H), state_dtype, "[layer, batch, head] log-scale stabiliser m"),
        ]

    def build_blocks(self, c, src, b):
        blocks = [XLSTMBlock(c, i, src, b) for i in range(c.num_layers)]
        norm = b.vector("out_norm", src["out_norm"], "norm")
        head = NormHead(b.matmul("head", src["head"].t(), "head"), norm, c.norm_eps)  # fp32 out: the soft cap follows
        return Embedding(b.table("emb", src["emb"], "embedding")), blocks, SoftCapHead(head, c.logit_soft_cap, b.recipe.logits_dtype)

    def build_prefill(self, c, decode, chunk):
        return None  # decode-only: prompts run through main, one token at a time

    def reference(self, c, weights) -> XLSTMReference:
        return XLSTMReference(c, weights)

    def keeps_float(self, name: str) -> bool:
        return name.rsplit(".", 1)[-1] in FLOAT_LEAVES


XLSTM = ssmport.register_architecture(
    _XLSTM(
        name="xlstm",
        description="xLSTM, mLSTM blocks (xLSTM-7B layout; example plugin, examples/xlstm.py)",
        hf_architectures=("xLSTMForCausalLM",),
        presets=(
            ssmport.Preset("xlstm-tiny", "xlstm", {"vocab_size": 256, "hidden_size": 128, "num_layers": 2,
                           "num_heads": 2, "qk_dim": 64, "v_dim": 128, "ffn_size": 384},
                           "L2 C128, 2 heads of dk 32 / dv 64 (synthetic)", released=False),
        ),  # fmt: skip
        tiny_preset="xlstm-tiny",
    )
)


# --------------------------------------------------------------------------------------
# The demo: a checkpoint on disk -> a gated bundle -> generated ids.
# --------------------------------------------------------------------------------------


def write_checkpoint(folder: Path, preset: str = "xlstm-tiny", seed: int = 7) -> Path:
    """A small xLSTMForCausalLM folder (config.json + model.safetensors) with seeded weights."""
    from safetensors.torch import save_file

    c = XLSTM.config_from_json(ssmport.presets()[preset].config)
    weights = XLSTM.synthetic_weights(c, seed)
    config_json = {
        "model_type": "xlstm", "architectures": ["xLSTMForCausalLM"], "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size, "num_hidden_layers": c.num_layers, "num_heads": c.num_heads,
        "qk_dim_factor": c.qk_dim / c.hidden_size, "v_dim_factor": c.v_dim / c.hidden_size,
        "ffn_proj_factor": c.ffn_size / c.hidden_size, "ffn_round_up_to_multiple_of": 64,
        "norm_eps": c.norm_eps, "eps": c.cell_eps, "gate_soft_cap": c.gate_soft_cap,
        "output_logit_soft_cap": c.logit_soft_cap, "weight_mode": "single", "use_bias": False,
        "add_out_norm": True, "tie_word_embeddings": False,
    }  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config_json, indent=2))
    tensors = {hf: weights[name].contiguous() for name, hf in hf_names(c).items()}
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: a temp dir)")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="xlstm-example-"))
    checkpoint = write_checkpoint(out / "xlstm-tiny-checkpoint")
    result = ssmport.export(checkpoint, out, quant="fp32", overwrite=True, progress=False)
    print(f"bundle: {result.path}\ngate:   {result.gate_headline}")
    if not result.manifest.gate.passed:
        return 1
    with ssmport.load(result.path) as runner:
        ids = list(runner.generate([1, 2, 3], max_tokens=12))
    print("generated ids:", ",".join(map(str, ids)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
