"""Deterministic random Qwen3.5-MoE weights: Qwen3.5's scales (experts and router by 1/sqrt(fan-in))."""

from ssmport.models.qwen3_5.synthetic import synthetic_init

__all__ = ["synthetic_init"]
