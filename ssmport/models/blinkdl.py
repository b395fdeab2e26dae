"""What BlinkDL's RWKV checkpoints share across versions (x060, x070): the tensors around the
layers, the layer count of a file, and the export form's embedding / blocks / head assembly."""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import nn

from ssmport.loader.checkpoint import TensorSource
from ssmport.errors import CheckpointError
from ssmport.graph import Embedding
from ssmport.models.layers.head import norm_head
from ssmport.models.loading import AS_IS, MAX_LAYERS, Stored, layer_count
from ssmport.quant.plan import WeightBuilder


def blinkdl_shapes(cfg, layer_shapes: Callable[[int], dict[str, tuple[int, ...]]]) -> dict[str, tuple[int, ...]]:
    """What every BlinkDL RWKV (x060, x070) has around its layers: the embedding, ln0, each
    layer's ln1/ln2 (then `layer_shapes(i)`), ln_out and the head."""
    C, V = cfg.hidden_size, cfg.vocab_size
    shapes: dict[str, tuple[int, ...]] = {"emb.weight": (V, C)}
    if cfg.has_ln0:
        shapes |= {"blocks.0.ln0.weight": (C,), "blocks.0.ln0.bias": (C,)}
    for i in range(cfg.num_layers):
        shapes |= {f"blocks.{i}.{ln}.{p}": (C,) for ln in ("ln1", "ln2") for p in ("weight", "bias")}
        shapes |= layer_shapes(i)
    return shapes | {"ln_out.weight": (C,), "ln_out.bias": (C,), "head.weight": (V, C)}


def fla_shared_rules(head: str) -> list[tuple[str, str, Stored]]:
    """The `renamed` rules of what fla's RWKV folders (rwkv6, rwkv7) name alike: the embedding,
    ln0 (layer 0's pre_norm), ln1 / ln2, ln_x (the attention's g_norm), ln_out and the head
    (`head`: its tensor, the embedding's when tied)."""
    L = r"blocks\.(\d+)\."
    return [
        ("emb.weight", "model.embeddings.weight", AS_IS),
        (r"blocks\.0\.ln0\.(\w+)", r"model.layers.0.pre_norm.\1", AS_IS),
        (L + r"ln1\.(\w+)", r"model.layers.\1.attn_norm.\2", AS_IS),
        (L + r"ln2\.(\w+)", r"model.layers.\1.ffn_norm.\2", AS_IS),
        (L + r"att\.ln_x\.(\w+)", r"model.layers.\1.attn.g_norm.\2", AS_IS),
        (r"ln_out\.(\w+)", r"model.norm.\1", AS_IS),
        ("head.weight", head, AS_IS),
    ]  # fmt: skip


def blinkdl_layers(source: TensorSource, need: list[str], family: str) -> int:
    """The layer count of a BlinkDL file that holds every tensor in `need` (a blocks.0.* among
    them), or a one-line refusal naming what it lacks."""
    absent = [n for n in need if n not in source]
    if absent:
        raise CheckpointError(f"{source.origin}: not an {family} checkpoint (missing {', '.join(absent)})")
    layers = layer_count(source, "blocks.")
    if layers > MAX_LAYERS:
        raise CheckpointError(f"{source.origin}: tensor names reach block {layers - 1}, beyond {MAX_LAYERS} layers")
    return layers


def blinkdl_model(cfg, src: TensorSource, b: WeightBuilder, block_class: type[nn.Module]):
    """(embedding, blocks, head) of a BlinkDL RWKV's export form (x060 and x070 alike). ln0 is
    per-row, so it is folded into the embedding table exactly."""
    emb = src["emb.weight"].float()
    if cfg.has_ln0:
        emb = F.layer_norm(emb, (cfg.hidden_size,), src["blocks.0.ln0.weight"], src["blocks.0.ln0.bias"], cfg.norm_eps)
    embed = Embedding(b.table("emb.weight", emb, "embedding"))
    del emb
    blocks = [block_class(cfg, i, src, b) for i in range(cfg.num_layers)]
    return embed, blocks, norm_head(src, b, "head.weight", "ln_out.weight", cfg.norm_eps, bias="ln_out.bias")
