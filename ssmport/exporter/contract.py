"""The graph contract of each function in a bundle, checked on the converted IR itself.

The IR is the ground truth of what ships: the names, order, shapes and dtypes of inputs,
states and outputs, and, for Apple's GPU delegate, that every state is written exactly once
per call (`coreai.write_handle` on its handle argument, at the top level of the graph:
a write inside a loop or branch body would run any number of times).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ssmport.errors import SsmportError
from ssmport.manifest import DYNAMIC_DIM, TensorEntry
from ssmport.state import StateSpec

_IR_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "si32": "int32", "si64": "int64",
              "si8": "int8", "ui8": "uint8"}  # fmt: skip
_NAME = re.compile(r'coreai\.name = "([^"]+)"')


@dataclass(frozen=True)
class GraphSignature:
    function: str
    inputs: tuple[TensorEntry, ...]
    states: tuple[TensorEntry, ...]
    outputs: tuple[TensorEntry, ...]
    writes_per_state: dict[str, int]  # top-level writes
    nested_writes: dict[str, int]  # writes inside a loop / branch region (must be 0)


def _parse_type(text: str) -> tuple[tuple[int, ...], str]:
    """`tensor<2x1x8xf32>` or `!coreai.handle<tensor<2x1x8xf32>>` -> ((2, 1, 8), "float32");
    a dynamic dimension (`?`) is -1, as the runtime's descriptors report it."""
    inner = re.search(r"tensor<([^>]*)>", text).group(1)
    *dims, elem = inner.split("x")
    return tuple(DYNAMIC_DIM if d == "?" else int(d) for d in dims), _IR_DTYPES.get(elem, elem)


def _names(attr) -> list[str]:
    return [_NAME.search(str(a)).group(1) for a in attr]


def _graphs(program) -> dict:
    ops = (op.operation for op in program._module._mlir_module.body.operations)
    return {str(o.attributes["sym_name"]).strip('"'): o for o in ops if o.name == "coreai.graph"}


def graph_names(program) -> list[str]:
    """The functions of a converted program, in order."""
    return list(_graphs(program))


def read_signature(program, function: str = "main") -> GraphSignature:
    """Read a converted program's interface by walking its IR (never printing it: the text
    of a multi-GB program costs gigabytes of memory even with constants elided)."""
    graph = _graphs(program).get(function)
    if graph is None:
        raise SsmportError(f"graph @{function} not found in the converted program")
    block = graph.regions[0].blocks[0]
    arg_names = _names(graph.attributes["arg_attrs"])
    inputs, states, handles = [], [], []
    for arg, name in zip(block.arguments, arg_names):
        sig = TensorEntry(name, *_parse_type(str(arg.type)))
        if str(arg.type).startswith("!coreai.handle"):
            states.append(sig)
            handles.append((arg, name))
        else:
            inputs.append(sig)
    result_types = re.findall(r"(tensor<[^>]*>|!coreai\.token)", str(graph.attributes["function_type"]).split("->", 1)[1])
    outputs = [
        TensorEntry(name, *_parse_type(t))
        for t, name in zip(result_types, _names(graph.attributes["res_attrs"]))
        if t.startswith("tensor")
    ]
    writes = {name: 0 for _, name in handles}
    nested = {name: 0 for _, name in handles}
    for inner, depth in _walk(block):
        if inner.name == "coreai.write_handle":
            target = inner.operands[0]
            for arg, name in handles:
                if target == arg:
                    (nested if depth else writes)[name] += 1
    return GraphSignature(function, tuple(inputs), tuple(states), tuple(outputs), writes, nested)


def _walk(block, depth: int = 0):
    """Every operation under `block`, with how many regions deep it sits."""
    for op in block.operations:
        o = op.operation
        yield o, depth
        for region in o.regions:
            for inner in region.blocks:
                yield from _walk(inner, depth + 1)


def check_contract(
    sig: GraphSignature,
    input_names: tuple[str, ...],
    output_names: tuple[str, ...],
    states: list[StateSpec],
) -> None:
    """Raise if the converted graph does not have exactly the declared interface."""
    problems = []
    if tuple(s.name for s in sig.inputs) != tuple(input_names):
        problems.append(f"inputs {[s.name for s in sig.inputs]} != {list(input_names)}")
    if tuple(s.name for s in sig.outputs) != tuple(output_names):
        problems.append(f"outputs {[s.name for s in sig.outputs]} != {list(output_names)}")
    declared = [(s.name, s.shape, s.numpy_dtype.name) for s in states]
    got = [(s.name, s.shape, s.dtype) for s in sig.states]
    if got != declared:
        problems.append(f"states {got} != declared {declared}")
    bad_writes = {n: c for n, c in sig.writes_per_state.items() if c != 1}
    if bad_writes:
        problems.append(f"each state must be written exactly once per call, got {bad_writes}")
    looped = {n: c for n, c in sig.nested_writes.items() if c}
    if looped:
        problems.append(f"states written inside a loop or branch body: {looped}")
    if problems:
        raise SsmportError(f"exported function @{sig.function} breaks its contract: " + "; ".join(problems))
