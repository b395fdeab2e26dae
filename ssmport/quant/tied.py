"""A tied embedding stored once: the table's rows read from the LM head's own storage.

A model that ties its LM head to its embedding (Qwen3.5 up to 4B, LFM2, RecurrentGemma, ...)
holds one [V, C] matrix, but the export form wants two stored layouts: the table's rows for
the lookup and the head's [C, V] (column blocks) for `x @ W`. Stored both ways the asset
keeps the matrix twice (a quarter of Qwen3.5-0.8B's fp32 asset). Where the head's stored
float weight holds exactly the table's values, the embedding instead gathers its row from the
head's constant, and the converter stores it once (measured: the asset drops by the table's
bytes). Equality is checked on the stored values, so the graph computes the same numbers
either way, whatever the checkpoint called the two tensors.

Not shared (measured with coreai-torch 0.4.3): a 4-bit head, whose packed levels a gather
cannot read ("index[0]: dtype si4 vs si8"); an int8 head and int8 table would share one
constant, but only `auto` stores tables as integers, and its budget counts the table's bytes
(`exporter.pipeline._check_auto_fit`), so `auto` plans are left as they are.
"""

from __future__ import annotations

import torch
from torch import nn

from ssmport.graph import Embedding
from ssmport.ops.matmul import FloatMatmul
from ssmport.quant.plan import WeightBuilder


class HeadColumns(nn.Module):
    """A lookup table read from an LM head's stored weight: `rows(ids)` is the head's columns."""

    def __init__(self, head_proj: nn.Module):
        super().__init__()
        self.head_proj = head_proj

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head_proj.columns(ids)


def store_tied_table_once(lm: nn.Module, builder: WeightBuilder) -> bool:
    """If `lm`'s embedding table is exactly its LM head's stored weight transposed, make the
    embedding read the head's storage and record the table as sharing it. Returns whether."""
    embed, proj = getattr(lm, "embed", None), getattr(getattr(lm, "head", None), "proj", None)
    if builder.recipe.per_tensor or not isinstance(embed, Embedding) or not isinstance(proj, FloatMatmul):
        return False
    table = embed.weight
    if not proj.holds_transpose_of(table):  # also False for a table that is not a float tensor
        return False
    builder.share(table, proj)
    del embed.weight  # the table's own copy goes
    embed.weight = HeadColumns(proj)
    return True


__all__ = ["HeadColumns", "store_tied_table_once"]
