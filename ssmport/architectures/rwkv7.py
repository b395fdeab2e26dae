"""Moved: the rwkv7 architecture is the package ssmport.models.rwkv7."""

import warnings

from ssmport.models.rwkv7 import RWKV7
from ssmport.models.rwkv7.config import PRESETS, RWKV7Config

warnings.warn("ssmport.architectures.rwkv7 moved to ssmport.models.rwkv7", DeprecationWarning, stacklevel=2)

__all__ = ["PRESETS", "RWKV7", "RWKV7Config"]
