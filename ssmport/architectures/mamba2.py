"""Moved: the mamba2 architecture is the package ssmport.models.mamba2."""

import warnings

from ssmport.models.mamba2 import MAMBA2
from ssmport.models.mamba2.config import PRESETS, Mamba2Config

warnings.warn("ssmport.architectures.mamba2 moved to ssmport.models.mamba2", DeprecationWarning, stacklevel=2)

__all__ = ["PRESETS", "MAMBA2", "Mamba2Config"]
