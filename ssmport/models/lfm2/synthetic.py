"""Deterministic random LFM2 weights (see `GeneratedSource`): unit-scale embeddings, gains
near 1, projections scaled by 1/sqrt(fan-in), the short conv by 1/sqrt(K)."""

from __future__ import annotations

from ssmport.models.lfm2.checkpoints import EMBEDDING, HEAD
from ssmport.models.mamba2.synthetic import weight_init

synthetic_init = weight_init(EMBEDDING, HEAD, ".conv.")
