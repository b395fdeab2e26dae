"""Reading a converted program's printed IR, independently of ssmport.contract."""

from __future__ import annotations

import re


def writes_per_state(program) -> dict[str, int]:
    """{state name: number of `coreai.write_handle` ops on its handle argument} of @main."""
    ir = str(program)
    header = re.search(r"coreai\.graph @main\((.*?)\) ->", ir, re.S).group(1)
    handles = dict(re.findall(r'%(arg\d+): !coreai\.handle<[^{]*\{[^}]*coreai\.name = "(\w+)"', header))
    return {name: len(re.findall(rf"coreai\.write_handle %{arg}\b", ir)) for arg, name in handles.items()}
