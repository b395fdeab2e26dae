"""RWKV-6 weights: canonical names (BlinkDL's, per-channel vectors squeezed to [C], nn.Linear
[out, in]), loaded from BlinkDL x060 `.pth` files (config from tensor shapes)."""

from __future__ import annotations

from collections.abc import Mapping

from ssmport.checkpoint import TensorSource
from ssmport.errors import CheckpointError
from ssmport.models.blinkdl import blinkdl_layers, blinkdl_shapes
from ssmport.models.loading import AS_IS, UNSQUEEZED, Stored, layout_view
from ssmport.models.rwkv6.config import MIX_NAMES, RWKV6Config


def canonical_shapes(cfg: RWKV6Config) -> dict[str, tuple[int, ...]]:
    return blinkdl_shapes(cfg, lambda i: _layer_shapes(cfg, i))


def _layer_shapes(cfg: RWKV6Config, i: int) -> dict[str, tuple[int, ...]]:
    C, F_, A, H, N = cfg.hidden_size, cfg.ffn_size, cfg.attention_size, cfg.num_heads, cfg.head_size
    a, f = f"blocks.{i}.att.", f"blocks.{i}.ffn."
    shapes = {f"{a}time_maa_{m}": (C,) for m in ("x", *MIX_NAMES)}
    return shapes | {
        f"{a}time_maa_w1": (C, len(MIX_NAMES) * cfg.mix_lora), f"{a}time_maa_w2": (len(MIX_NAMES), cfg.mix_lora, C),
        f"{a}time_decay": (A,), f"{a}time_decay_w1": (C, cfg.decay_lora), f"{a}time_decay_w2": (cfg.decay_lora, A),
        f"{a}time_faaaa": (H, N),
        f"{a}receptance.weight": (A, C), f"{a}key.weight": (A, C), f"{a}value.weight": (A, C),
        f"{a}gate.weight": (A, C), f"{a}output.weight": (C, A),
        f"{a}ln_x.weight": (A,), f"{a}ln_x.bias": (A,),
        f"{f}time_maa_k": (C,), f"{f}time_maa_r": (C,),
        f"{f}key.weight": (F_, C), f"{f}receptance.weight": (C, C), f"{f}value.weight": (C, F_),
    }  # fmt: skip


# --- BlinkDL .pth ----------------------------------------------------------------------

_UNSQUEEZED_1x1 = ("time_maa_x", "time_maa_w", "time_maa_k", "time_maa_v", "time_maa_r", "time_maa_g", "time_decay")


def blinkdl_layout(canonical: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[str, Stored]]:
    """BlinkDL's names are the canonical ones; its per-channel vectors are saved [1, 1, C]."""
    return {n: (n, UNSQUEEZED if n.rsplit(".", 1)[-1] in _UNSQUEEZED_1x1 else AS_IS) for n in canonical}


def is_x060(source: TensorSource) -> bool:
    """x060's marks: the data-dependent token shift (time_maa_*) and the bonus time_faaaa
    (x070 has neither; x052 has time_faaaa without time_maa)."""
    return "blocks.0.att.time_maa_w1" in source and "blocks.0.att.time_faaaa" in source


def load_blinkdl(source: TensorSource) -> tuple[RWKV6Config, TensorSource]:
    layers = blinkdl_layers(source, ["emb.weight", "blocks.0.att.time_faaaa", "blocks.0.att.time_maa_w2",
                                     "blocks.0.att.time_decay_w1", "blocks.0.att.key.weight", "blocks.0.ffn.key.weight"],
                            "RWKV-6")  # fmt: skip
    emb, u, maa2 = source.shape("emb.weight"), source.shape("blocks.0.att.time_faaaa"), source.shape("blocks.0.att.time_maa_w2")
    if len(emb) != 2 or len(u) != 2 or len(maa2) != 3 or 0 in emb + u + maa2:  # every size below is read from these
        raise CheckpointError(f"{source.origin}: emb.weight {list(emb)}, blocks.0.att.time_faaaa {list(u)} and "
                              f"blocks.0.att.time_maa_w2 {list(maa2)} are not an RWKV-6 model's [vocab, width], "
                              "[heads, head size] and [5, rank, width]")  # fmt: skip
    cfg = RWKV6Config(
        vocab_size=emb[0], hidden_size=emb[1], num_layers=layers, attention_size=u[0] * u[1], head_size=u[1],
        ffn_size=source.shape("blocks.0.ffn.key.weight")[0], mix_lora=maa2[1],
        decay_lora=source.shape("blocks.0.att.time_decay_w1")[-1], has_ln0="blocks.0.ln0.weight" in source,
    )  # fmt: skip
    cfg.validate()
    canonical = canonical_shapes(cfg)
    return cfg, layout_view(source, canonical, blinkdl_layout(canonical), f"RWKV-6 {cfg.describe()}")
