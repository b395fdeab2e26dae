"""Deterministic random LFM3 weights: LFM2's init (unit-scale embeddings, gains near 1,
projections scaled by 1/sqrt(fan-in), the short conv by 1/sqrt(K))."""

from __future__ import annotations

from ssmport.models.lfm2.synthetic import synthetic_init

__all__ = ["synthetic_init"]
