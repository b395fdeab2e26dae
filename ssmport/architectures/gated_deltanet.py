"""Moved: the gated_deltanet architecture is the package ssmport.models.gated_deltanet."""

import warnings

from ssmport.models.gated_deltanet import GATED_DELTANET
from ssmport.models.gated_deltanet.config import PRESETS, GatedDeltaNetConfig

warnings.warn("ssmport.architectures.gated_deltanet moved to ssmport.models.gated_deltanet", DeprecationWarning, stacklevel=2)

__all__ = ["PRESETS", "GATED_DELTANET", "GatedDeltaNetConfig"]
