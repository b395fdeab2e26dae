"""JSON from files a checkpoint brings (config.json), numbers finite.

Python's json reads `1e400` as inf and accepts the non-standard `NaN` / `Infinity`; an
infinite layer count then failed deep inside (OverflowError, exit 70). Here both are
ValueErrors, which the caller reports as the file's invalid JSON.
"""

from __future__ import annotations

import json
import math
from typing import Any


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is beyond a 64-bit float")
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def loads_finite(text: str | bytes) -> Any:
    """`json.loads`, refusing numbers that overflow a double and NaN / Infinity (ValueError)."""
    return json.loads(text, parse_float=_finite, parse_constant=_no_constant)
