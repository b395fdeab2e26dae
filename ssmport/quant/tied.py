"""A tied embedding stored once: the table's rows read from the LM head's own storage.

A model that ties its LM head to its embedding (Qwen3.5 up to 4B, LFM2, RecurrentGemma, ...)
holds one [V, C] matrix, but the export form wants two stored layouts: the table's rows for
the lookup and the head's [C, V] (column blocks) for `x @ W`. Stored both ways the asset
keeps the matrix twice (a quarter of Qwen3.5-0.8B's fp32 asset). Where the head's stored
weight holds exactly the table, the embedding instead gathers its row from the head's
constant, and the converter stores it once (measured: the asset drops by the table's bytes).

- A float head: its stored values must be the table's, so the graph computes the same
  numbers either way, whatever the checkpoint called the two tensors.
- A symmetric int8 head (int8keepproj, int4keepproj, int8): its levels and scales must be
  the table's source quantized the head's way (compared bit for bit). The embedding then
  reads the int8 levels times their scales where it read fp16 values: a precision change of
  the embedding, so only where the recipe says (`Recipe.int8_tied_table`: int4keepproj, whose
  own error it measured small against; docs/quantization.md, "A tied table read from an int8
  head") or the export asks (--int8-tied-table).

- An `auto` plan shares only where it chose to (`quant.auto.SHARED`: its budget counted the
  table as read from the int8 head, `Recipe.int8_tied_table` then set); its other tables are
  stored as counted (`exporter.pipeline._check_auto_fit`), a float head's too.

Not shared (measured with coreai-torch 0.4.3): a 4-bit head, whose packed levels a gather
cannot read ("index[0]: dtype si4 vs si8").
"""

from __future__ import annotations

import torch
from torch import nn

from ssmport.graph import Embedding
from ssmport.ops.matmul import BlockwiseMatmul, FloatMatmul
from ssmport.quant.blockwise import quantize_blockwise
from ssmport.quant.plan import QUANT_CHUNK_COLUMNS, WeightBuilder


class HeadColumns(nn.Module):
    """A lookup table read from an LM head's stored weight: `rows(ids)` is the head's columns."""

    def __init__(self, head_proj: nn.Module):
        super().__init__()
        self.head_proj = head_proj

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head_proj.columns(ids)


def store_tied_table_once(lm: nn.Module, builder: WeightBuilder) -> bool:
    """If `lm`'s embedding table is exactly its LM head's stored weight transposed (a float
    head, not under an `auto` plan), or the head's int8 levels are the table quantized (where
    the recipe's `int8_tied_table` says, an `auto` plan's included), make the embedding read the
    head's storage and record the table as sharing it. Returns whether."""
    sources = builder.take_table_sources()
    embed, proj = getattr(lm, "embed", None), getattr(getattr(lm, "head", None), "proj", None)
    if not isinstance(embed, Embedding):
        return False
    table = embed.weight
    if isinstance(proj, FloatMatmul) and not builder.recipe.per_tensor:  # auto counted a float head's table
        tied = proj.holds_transpose_of(table)  # also False for a table that is not a float tensor
    elif isinstance(proj, BlockwiseMatmul) and builder.recipe.int8_tied_table:
        tied = id(table) in sources and quantizes_to(sources[id(table)], proj)
    else:
        tied = False
    if tied:
        builder.share(table, proj)
        del embed.weight  # the table's own copy goes
        embed.weight = HeadColumns(proj)
    return tied


def quantizes_to(table: torch.Tensor, head: BlockwiseMatmul) -> bool:
    """Whether symmetric int8 `head` holds `table` [V, C] transposed as the builder quantizes a
    matmul: the same levels and fp16 scales, bit for bit (a chunk of columns at a time, as
    quant.plan quantizes them, so no temporaries of a whole head)."""
    q, scale = head.dequant.quantized_data, head.dequant.scale
    if not head.symmetric_int8 or tuple(table.shape) != (q.shape[1], q.shape[0]):
        return False
    for start in range(0, q.shape[1], QUANT_CHUNK_COLUMNS):
        cols = slice(start, start + QUANT_CHUNK_COLUMNS)
        b = quantize_blockwise(table[cols].t(), bits=8)
        if not (torch.equal(b.q, q[:, cols]) and torch.equal(b.scale, scale[:, cols])):
            return False
    return True


__all__ = ["HeadColumns", "quantizes_to", "store_tied_table_once"]
