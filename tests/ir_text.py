"""Reading a converted program's printed IR independently of ssmport's contract module."""

from __future__ import annotations

import re


def writes_per_state_in_text(program) -> dict[str, int]:
    """`coreai.write_handle` count per state handle argument of @main, from the IR text."""
    ir = str(program)
    header = re.search(r"coreai\.graph @main\((.*?)\) ->", ir, re.S).group(1)
    handles = dict(re.findall(r'%(arg\d+): !coreai\.handle<[^{]*\{[^}]*coreai\.name = "(\w+)"', header))
    return {name: len(re.findall(rf"coreai\.write_handle %{arg}\b", ir)) for arg, name in handles.items()}
