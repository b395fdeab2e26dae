"""Deterministic random Nemotron-H weights (see `GeneratedSource`): Mamba-2's init for the
mixers (ssmport.models.mamba2.synthetic), 1/sqrt(fan-in) projections, gains near 1."""

from __future__ import annotations

from ssmport.models.mamba2.synthetic import weight_init
from ssmport.models.nemotron_h.checkpoints import EMBEDDING, HEAD

synthetic_init = weight_init(EMBEDDING, HEAD, ".mixer.")
