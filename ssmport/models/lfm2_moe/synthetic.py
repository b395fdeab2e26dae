"""Deterministic random LFM2-MoE weights: LFM2's scales (experts and router by 1/sqrt(fan-in))."""

from ssmport.models.lfm2.synthetic import synthetic_init

__all__ = ["synthetic_init"]
