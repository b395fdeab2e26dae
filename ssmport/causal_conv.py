"""Moved: the causal short conv is ssmport.ops.conv.causal_conv."""

import warnings

from ssmport.ops.conv import causal_conv

warnings.warn("ssmport.causal_conv moved to ssmport.ops.conv", DeprecationWarning, stacklevel=2)

__all__ = ["causal_conv"]
