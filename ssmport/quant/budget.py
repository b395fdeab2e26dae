"""A size budget as the user writes it: `--size-budget 3.5MB`."""

from __future__ import annotations

import re

from ssmport.errors import SsmportError

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}  # fmt: skip


def parse_size(text: str, what: str = "--size-budget") -> int:
    """'3.5MB', '2.2GB', '900KB', '123456' -> bytes. Binary units, as `ssmport inspect` prints
    sizes (1 MB = 1024 KB). `what` names the option or variable in the error."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = m and _UNITS.get(m.group(2).lower())
    if not m or unit is None or float(m.group(1)) <= 0:
        raise SsmportError(f"{what} {text!r} is not a size: give a positive number with B, KB, MB or GB "
                           "(e.g. 3.5MB, 2.2GB)")  # fmt: skip
    return int(float(m.group(1)) * unit)
