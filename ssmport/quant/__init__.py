"""Quantization: recipes as data, the per-tensor plan, and the int8 blockwise store."""

from ssmport.quant.recipes import BLOCK_SIZE, RECIPES, GateThresholds, Recipe, get_recipe

__all__ = ["BLOCK_SIZE", "RECIPES", "GateThresholds", "Recipe", "get_recipe"]
