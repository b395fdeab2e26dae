"""RWKV-7 weights: canonical names (BlinkDL's, singleton dims squeezed, nn.Linear [out, in]),
and the two layouts they load from: BlinkDL `.pth` (config from tensor shapes) and fla /
Hugging Face folders (config.json, fla's names)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ssmport.loader.checkpoint import TensorSource
from ssmport.errors import CheckpointError
from ssmport.models.blinkdl import blinkdl_layers, blinkdl_shapes, fla_shared_rules
from ssmport.models.loading import (AS_IS, FLAT_OR_UNSQUEEZED, TRANSPOSED, UNSQUEEZED, ConfigReader, Stored, check_layer_count,
                                    head_name, storage_view, renamed, stacked_row)
from ssmport.models.rwkv7.config import MIX_NAMES, RWKV7Config


def canonical_shapes(cfg: RWKV7Config) -> dict[str, tuple[int, ...]]:
    return blinkdl_shapes(cfg, lambda i: _layer_shapes(cfg, i))


def _layer_shapes(cfg: RWKV7Config, i: int) -> dict[str, tuple[int, ...]]:
    C, F_, H, N, Cv = cfg.hidden_size, cfg.ffn_size, cfg.num_heads, cfg.head_size, cfg.value_size
    a, f = f"blocks.{i}.att.", f"blocks.{i}.ffn."
    shapes = {f"{a}x_{m}": (C,) for m in MIX_NAMES}
    shapes |= {
        f"{a}w0": (C,), f"{a}w1": (C, cfg.decay_lora), f"{a}w2": (cfg.decay_lora, C),
        f"{a}a0": (C,), f"{a}a1": (C, cfg.a_lora), f"{a}a2": (cfg.a_lora, C),
        f"{a}g1": (C, cfg.gate_lora), f"{a}g2": (cfg.gate_lora, Cv),
        f"{a}k_k": (C,), f"{a}k_a": (C,), f"{a}r_k": (H, N),
        f"{a}receptance.weight": (C, C), f"{a}key.weight": (C, C),
        f"{a}value.weight": (Cv, C), f"{a}output.weight": (C, Cv),
        f"{a}ln_x.weight": (Cv,), f"{a}ln_x.bias": (Cv,),
        f"{f}x_k": (C,), f"{f}key.weight": (F_, C), f"{f}value.weight": (C, F_),
    }  # fmt: skip
    if i > 0:  # layer 0 takes v as v_first; its v-LoRA is unused (and often absent)
        shapes |= {f"{a}v0": (Cv,), f"{a}v1": (C, cfg.v_lora), f"{a}v2": (cfg.v_lora, Cv)}
    return shapes


# --- BlinkDL .pth ----------------------------------------------------------------------

_UNSQUEEZED_1x1 = ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g", "w0", "a0", "v0", "k_k", "k_a")


def blinkdl_storage(canonical: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[str, Stored]]:
    """BlinkDL's names are the canonical ones; its per-channel vectors are saved [1, 1, C]."""
    return {n: (n, UNSQUEEZED if n.rsplit(".", 1)[-1] in _UNSQUEEZED_1x1 else AS_IS) for n in canonical}


def load_blinkdl(source: TensorSource) -> tuple[RWKV7Config, TensorSource]:
    layers = blinkdl_layers(source, ["emb.weight", "blocks.0.att.r_k", "blocks.0.ffn.key.weight", "blocks.0.att.w1",
                                     "blocks.0.att.a1", "blocks.0.att.g1"], "RWKV-7")  # fmt: skip
    emb, r_k = source.shape("emb.weight"), source.shape("blocks.0.att.r_k")
    if len(emb) != 2 or len(r_k) != 2 or 0 in emb + r_k:  # every size below is read from these two
        raise CheckpointError(f"{source.origin}: emb.weight {list(emb)} and blocks.0.att.r_k {list(r_k)} are not "
                              "an RWKV-7 model's [vocab, width] and [heads, head size]")  # fmt: skip
    vocab, width = emb
    heads, head_size = r_k
    v1 = next((f"blocks.{i}.att.v1" for i in (*range(1, layers), 0) if f"blocks.{i}.att.v1" in source), None)
    cfg = RWKV7Config(
        vocab_size=vocab, hidden_size=width, num_layers=layers, head_size=head_size,
        ffn_size=source.shape("blocks.0.ffn.key.weight")[0], decay_lora=source.shape("blocks.0.att.w1")[-1],
        a_lora=source.shape("blocks.0.att.a1")[-1], v_lora=source.shape(v1)[-1] if v1 else 32,
        gate_lora=source.shape("blocks.0.att.g1")[-1], has_ln0="blocks.0.ln0.weight" in source,
    )  # fmt: skip
    cfg.validate()
    # Layer 0's v0/v1/v2 are unused by the math; checkpoints may or may not carry them.
    optional = {"blocks.0.att.v0": (1, 1, cfg.value_size), "blocks.0.att.v1": (cfg.hidden_size, cfg.v_lora),
                "blocks.0.att.v2": (cfg.v_lora, cfg.value_size)}  # fmt: skip
    canonical = canonical_shapes(cfg)
    return cfg, storage_view(source, canonical, blinkdl_storage(canonical), f"RWKV-7 {cfg.describe()}", optional)


# --- fla / Hugging Face -----------------------------------------------------------------

def fla_storage(cfg: RWKV7Config, head: str, stacked_mixes: bool) -> dict[str, tuple[str, Stored]]:
    """canonical name -> (fla name, how fla stores it). `stacked_mixes`: fla between 2025-01-20
    and 2025-04-09 stored the six token-shift mixes as one `attn.x_x` [6, C] (rows r, w, k, v, a, g);
    per-channel vectors were saved [C] or [1, 1, C], depending on the fla version."""
    L = r"blocks\.(\d+)\."
    rules = fla_shared_rules(head) + [
        *((L + f"att\\.x_{m}", r"model.layers.\1.attn.x_x", stacked_row(j, len(MIX_NAMES)))
          for j, m in enumerate(MIX_NAMES) if stacked_mixes),
        (L + r"att\.([wavg])1", r"model.layers.\1.attn.\2_lora.lora.0.weight", TRANSPOSED),
        (L + r"att\.([wavg])2", r"model.layers.\1.attn.\2_lora.lora.2.weight", TRANSPOSED),
        (L + r"att\.([wav])0", r"model.layers.\1.attn.\2_lora.lora.2.bias", AS_IS),
        (L + r"att\.(x_\w|k_k|k_a)", r"model.layers.\1.attn.\2", FLAT_OR_UNSQUEEZED),
        (L + r"att\.r_k", r"model.layers.\1.attn.r_k", AS_IS),
        *((L + f"att\\.{ours}\\.weight", f"model.layers.\\1.attn.{theirs}.weight", AS_IS) for ours, theirs in
          (("receptance", "r_proj"), ("key", "k_proj"), ("value", "v_proj"), ("output", "o_proj"))),
        (L + r"ffn\.x_k", r"model.layers.\1.ffn.x_k", FLAT_OR_UNSQUEEZED),
        (L + r"ffn\.(key|value)\.weight", r"model.layers.\1.ffn.\2.weight", AS_IS),
    ]  # fmt: skip
    return renamed(canonical_shapes(cfg), rules)


def _config_from_fla(cj: Mapping[str, Any], source: TensorSource) -> RWKV7Config:
    r = ConfigReader(cj, source.origin, "RWKV-7")
    r.refuse({"hybrid attention layers ('attn')": cj.get("attn") not in (None, {}),
              f"hidden_act={cj.get('hidden_act')!r}": cj.get("hidden_act", "sqrelu") != "sqrelu",
              "norm_bias=false": cj.get("norm_bias", True) is not True})  # fmt: skip
    width, layers, vocab = r.int("hidden_size"), r.layers("num_hidden_layers"), r.int("vocab_size")
    check_layer_count(layers, source, "model.layers.", source.origin)
    if cj.get("head_dim") is None and not cj.get("num_heads"):
        raise CheckpointError(f"{source.origin}: config.json sets neither head_dim nor num_heads")
    head_dim = r.int("head_dim") if cj.get("head_dim") is not None else r.size("hidden_size/num_heads", width / r.int("num_heads"))
    value_dim = cj.get("value_dim")
    if isinstance(value_dim, list):
        if len(set(map(repr, value_dim))) > 1:
            raise r.unsupported("per-layer value_dim (the stacked recState needs one value size)")
        value_dim = value_dim[0] if value_dim else None
    value_dim = width if value_dim is None else r.size("value_dim", value_dim)
    heads = width // head_dim
    if width % head_dim or value_dim % max(heads, 1):
        raise CheckpointError(f"{source.origin}: config.json hidden_size={width} and value_dim={value_dim} do not "
                              f"divide into heads of head_dim={head_dim}")  # fmt: skip
    # fla: hidden_size * hidden_ratio, rounded up to a multiple of 32
    ffn = r.int("intermediate_size") if cj.get("intermediate_size") is not None else \
        r.size("hidden_size*hidden_ratio", 32 * ((int(width * r.float("hidden_ratio", 4, positive=True)) + 31) // 32))

    def lora(key: str, weight: str) -> int:
        if cj.get(key) is not None:
            return r.int(key)
        return source.shape(weight)[0] if weight in source else 32  # fla derives unset ranks

    norm_eps = r.float("norm_eps", 1e-5, positive=True)
    return RWKV7Config(
        vocab_size=vocab, hidden_size=width, num_layers=layers, head_size=head_dim, ffn_size=ffn,
        decay_lora=lora("decay_low_rank_dim", "model.layers.0.attn.w_lora.lora.0.weight"),
        a_lora=lora("a_low_rank_dim", "model.layers.0.attn.a_lora.lora.0.weight"),
        v_lora=lora("v_low_rank_dim", "model.layers.1.attn.v_lora.lora.0.weight"),
        gate_lora=lora("gate_low_rank_dim", "model.layers.0.attn.g_lora.lora.0.weight"),
        value_head_size=None if value_dim == width else value_dim // heads,
        ln_x_eps=head_dim * norm_eps,  # fla: GroupNorm eps = head_dim * norm_eps
        norm_eps=norm_eps, has_ln0=r.bool("norm_first", True),
    )  # fmt: skip


def load_fla(config_json: Mapping[str, Any], source: TensorSource) -> tuple[RWKV7Config, TensorSource]:
    cfg = _config_from_fla(config_json, source)
    cfg.validate()
    tied = ConfigReader(config_json, source.origin, "RWKV-7").bool("tie_word_embeddings", False)
    storage = fla_storage(cfg, head_name(tied, source, "lm_head.weight", "model.embeddings.weight"),
                        stacked_mixes="model.layers.0.attn.x_x" in source)  # fmt: skip
    return cfg, storage_view(source, canonical_shapes(cfg), storage, f"RWKV-7 {cfg.describe()} (fla layout)")
