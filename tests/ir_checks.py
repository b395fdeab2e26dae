"""Reading a converted program's printed IR, independently of ssmport.exporter.contract."""

from __future__ import annotations

import re


def graph_texts(program) -> dict[str, str]:
    """{function name: its printed graph}, in program order."""
    return dict(re.findall(r"coreai\.graph @(\w+)(.*?)(?=coreai\.graph @|\Z)", str(program), re.S))


def writes_per_state(program, function: str = "main", top_level_only: bool = False) -> dict[str, int]:
    """{state name: number of `coreai.write_handle` ops on its handle argument} of @function.

    `top_level_only`: count only writes in the graph body itself (printed at 4 spaces), not
    those inside a loop or branch region.
    """
    text = graph_texts(program)[function]
    header = text[: text.index(") ->")]
    handles = dict(re.findall(r'%(arg\d+): !coreai\.handle<[^{]*\{[^}]*coreai\.name = "(\w+)"', header))
    indent = "    " if top_level_only else " *"
    return {
        name: len(re.findall(rf"^{indent}(?:%\S+ = )?coreai\.write_handle %{arg}\b", text, re.M))
        for arg, name in handles.items()
    }
