"""RWKV-6 weights: canonical names (BlinkDL's, per-channel vectors squeezed to [C], nn.Linear
[out, in]), loaded from BlinkDL x060 `.pth` files (config from tensor shapes) and fla's `rwkv6`
Hugging Face folders (config.json, fla's names)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ssmport.loader.checkpoint import TensorSource
from ssmport.errors import CheckpointError
from ssmport.models.blinkdl import blinkdl_layers, blinkdl_shapes, fla_shared_rules
from ssmport.models.loading import (AS_IS, TRANSPOSED, UNSQUEEZED, ConfigReader, Stored, check_layer_count, head_name,
                                    storage_view, renamed, stacked_row)
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


def blinkdl_storage(canonical: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[str, Stored]]:
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
    return cfg, storage_view(source, canonical, blinkdl_storage(canonical), f"RWKV-6 {cfg.describe()}")


# --- fla / Hugging Face -----------------------------------------------------------------

# fla keeps the five mixes in another order than BlinkDL: x_bias rows, and the column groups
# of x_proj.0 / x_proj.2, are r, w, k, v, g.
_FLA_MIX_ORDER = ("r", "w", "k", "v", "g")
_FLA_ROWS = [_FLA_MIX_ORDER.index(m) for m in MIX_NAMES]  # fla's group of each canonical mix


def _maa_w1(t):  # x_proj.0.linear.weight [5D, C], groups in fla's order -> time_maa_w1 [C, 5D]
    return t.float().view(5, -1, t.shape[1])[_FLA_ROWS].reshape(-1, t.shape[1]).t()


def _maa_w2(t):  # x_proj.2.weight [C, 5D], groups in fla's order -> time_maa_w2 [5, D, C]
    return t.float().t().reshape(5, -1, t.shape[0])[_FLA_ROWS]


def fla_storage(cfg: RWKV6Config, head: str) -> dict[str, tuple[str, Stored]]:
    """canonical name -> (fla's RWKV6ForCausalLM name, how fla stores it)."""
    L, a = r"blocks\.(\d+)\.", r"blocks\.(\d+)\.att\."
    rules = fla_shared_rules(head) + [
        (a + "time_maa_x", r"model.layers.\1.attn.x_proj.0.mu", AS_IS),
        (a + "time_maa_w1", r"model.layers.\1.attn.x_proj.0.linear.weight", Stored(lambda s: ((s[1], s[0]),), _maa_w1)),
        (a + "time_maa_w2", r"model.layers.\1.attn.x_proj.2.weight", Stored(lambda s: ((s[2], s[0] * s[1]),), _maa_w2)),
        *((a + f"time_maa_{m}", r"model.layers.\1.attn.x_bias", stacked_row(_FLA_MIX_ORDER.index(m), 5)) for m in MIX_NAMES),
        (a + "time_decay", r"model.layers.\1.attn.w_proj.linear.lora.2.bias", AS_IS),
        (a + "time_decay_w1", r"model.layers.\1.attn.w_proj.linear.lora.0.weight", TRANSPOSED),
        (a + "time_decay_w2", r"model.layers.\1.attn.w_proj.linear.lora.2.weight", TRANSPOSED),
        (a + "time_faaaa", r"model.layers.\1.attn.bonus", AS_IS),
        *((a + f"{ours}\\.weight", f"model.layers.\\1.attn.{x}_proj.linear.weight", AS_IS)
          for ours, x in (("receptance", "r"), ("key", "k"), ("value", "v"), ("gate", "g"))),
        (a + r"output\.weight", r"model.layers.\1.attn.o_proj.weight", AS_IS),
        *((L + f"ffn\\.time_maa_{m}", f"model.layers.\\1.ffn.{proj}.mu", AS_IS) for m, proj in (("k", "key"), ("r", "receptance"))),
        (L + r"ffn\.(key|receptance)\.weight", r"model.layers.\1.ffn.\2.linear.weight", AS_IS),
        (L + r"ffn\.value\.weight", r"model.layers.\1.ffn.value.weight", AS_IS),
    ]  # fmt: skip
    return renamed(canonical_shapes(cfg), rules)


# fla's RWKV6Config defaults: save_pretrained writes every key, but a hand-written config may not
_FLA_DEFAULTS = {"expand_k": 0.5, "expand_v": 1.0, "num_heads": 4, "proj_low_rank_dim": 32, "gate_low_rank_dim": 64,
                 "norm_first": True, "norm_eps": 1e-5, "tie_word_embeddings": False}  # fmt: skip


def _config_from_fla(cj: Mapping[str, Any], source: TensorSource) -> RWKV6Config:
    if "rwkv.embeddings.weight" in source:
        raise CheckpointError(f"{source.origin}: RWKV's own Hugging Face layout (Rwkv6ForCausalLM, rwkv.blocks.*) is not "
                              "supported; export the BlinkDL .pth it was converted from, or an fla folder")  # fmt: skip
    r = ConfigReader(cj, source.origin, "RWKV-6", _FLA_DEFAULTS)
    r.refuse({"hybrid attention layers ('attn')": cj.get("attn") not in (None, {}),
              f"hidden_act={cj.get('hidden_act')!r}": cj.get("hidden_act", "sqrelu") != "sqrelu",
              "norm_bias=false": cj.get("norm_bias", True) is not True})  # fmt: skip
    width, layers = r.int("hidden_size"), r.layers("num_hidden_layers")
    check_layer_count(layers, source, "model.layers.", source.origin)
    # fla: key and value widths int(hidden_size * expand_k / expand_v); x060 has one
    key_dim = r.size("hidden_size*expand_k", int(width * r.float("expand_k", positive=True)))
    value_dim = r.size("hidden_size*expand_v", int(width * r.float("expand_v", positive=True)))
    if key_dim != value_dim:
        raise r.unsupported(f"key width {key_dim} != value width {value_dim} (expand_k != expand_v)")
    heads = r.int("num_heads")
    if key_dim % heads:
        raise CheckpointError(f"{source.origin}: config.json key width {key_dim} does not divide into num_heads={heads}")
    # fla: intermediate_size, else hidden_size * hidden_ratio (null: 3.5) rounded up to a multiple of 32
    ratio = 3.5 if cj.get("hidden_ratio") is None else r.float("hidden_ratio", positive=True)
    ffn = r.int("intermediate_size") if cj.get("intermediate_size") is not None else \
        r.size("hidden_size*hidden_ratio", 32 * ((int(width * ratio) + 31) // 32))
    norm_eps = r.float("norm_eps", positive=True)
    return RWKV6Config(
        vocab_size=r.int("vocab_size"), hidden_size=width, num_layers=layers, attention_size=key_dim,
        head_size=key_dim // heads, ffn_size=ffn, mix_lora=r.int("proj_low_rank_dim"),
        decay_lora=r.int("gate_low_rank_dim"),  # fla's name for the decay LoRA's rank
        # fla's g_norm takes norm_eps (its converter sets BlinkDL's 64e-5 on the module only,
        # which save_pretrained does not keep): the folder computes with norm_eps
        ln_x_eps=norm_eps, norm_eps=norm_eps, has_ln0=r.bool("norm_first"),
    )  # fmt: skip


def load_fla(config_json: Mapping[str, Any], source: TensorSource) -> tuple[RWKV6Config, TensorSource]:
    cfg = _config_from_fla(config_json, source)
    cfg.validate()
    tied = ConfigReader(config_json, source.origin, "RWKV-6", _FLA_DEFAULTS).bool("tie_word_embeddings")
    storage = fla_storage(cfg, head_name(tied, source, "lm_head.weight", "model.embeddings.weight"))
    return cfg, storage_view(source, canonical_shapes(cfg), storage, f"RWKV-6 {cfg.describe()} (fla layout)")
