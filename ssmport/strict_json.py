"""JSON with finite numbers only, read and written.

Python's json reads `1e400` as inf and accepts the non-standard `NaN` / `Infinity`; an
infinite layer count in a config.json then failed deep inside (OverflowError, exit 70).
`loads_finite` makes both ValueErrors, which the caller reports as the file's invalid JSON.
`dumps_standard` writes what other JSON readers accept: a NaN (a gate's |Δ| on a bundle
whose logits overflowed) as null, where `inspect --json` printed a bare `NaN`.
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


def _standard(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _standard(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_standard(v) for v in value]
    return value


def dumps_standard(value: Any, **kw) -> str:
    """`json.dumps` with NaN and infinities written as null (standard JSON)."""
    return json.dumps(_standard(value), allow_nan=False, **kw)
