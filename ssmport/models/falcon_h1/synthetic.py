"""Deterministic random Falcon-H1 weights (see `GeneratedSource`): Mamba-2's init for the
mixers (ssmport.models.mamba2.synthetic), 1/sqrt(fan-in) projections, gains near 1."""

from __future__ import annotations

from ssmport.models.falcon_h1.checkpoints import EMBEDDING, HEAD
from ssmport.models.mamba2.synthetic import weight_init

synthetic_init = weight_init(EMBEDDING, HEAD, ".mamba.")
