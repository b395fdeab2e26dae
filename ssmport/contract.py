"""The decode graph's contract, checked on the converted IR itself.

The IR is the ground truth of what ships: the names, order, shapes and dtypes of inputs,
states and outputs, and, for Apple's GPU delegate, that every state is written exactly once
per call (`coreai.write_handle` on its handle argument).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ssmport.errors import SsmportError
from ssmport.state import StateSpec

_IR_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "si32": "int32", "si64": "int64",
              "si8": "int8", "ui8": "uint8"}  # fmt: skip
_NAME = re.compile(r'coreai\.name = "([^"]+)"')


@dataclass(frozen=True)
class TensorSig:
    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class GraphSignature:
    function: str
    inputs: tuple[TensorSig, ...]
    states: tuple[TensorSig, ...]
    outputs: tuple[TensorSig, ...]
    writes_per_state: dict[str, int]


def _parse_type(text: str) -> tuple[tuple[int, ...], str]:
    """`tensor<2x1x8xf32>` or `!coreai.handle<tensor<2x1x8xf32>>` -> ((2, 1, 8), "float32")."""
    inner = re.search(r"tensor<([^>]*)>", text).group(1)
    *dims, elem = inner.split("x")
    return tuple(int(d) for d in dims), _IR_DTYPES.get(elem, elem)


def _names(attr) -> list[str]:
    return [_NAME.search(str(a)).group(1) for a in attr]


def read_signature(program, function: str = "main") -> GraphSignature:
    """Read a converted program's interface by walking its IR (never printing it: the text
    of a multi-GB program costs gigabytes of memory even with constants elided)."""
    graph = None
    for op in program._module._mlir_module.body.operations:
        o = op.operation
        if o.name == "coreai.graph" and str(o.attributes["sym_name"]).strip('"') == function:
            graph = o
            break
    if graph is None:
        raise SsmportError(f"graph @{function} not found in the converted program")
    block = graph.regions[0].blocks[0]
    arg_names = _names(graph.attributes["arg_attrs"])
    inputs, states, handles = [], [], []
    for arg, name in zip(block.arguments, arg_names):
        sig = TensorSig(name, *_parse_type(str(arg.type)))
        if str(arg.type).startswith("!coreai.handle"):
            states.append(sig)
            handles.append((arg, name))
        else:
            inputs.append(sig)
    result_types = re.findall(r"(tensor<[^>]*>|!coreai\.token)", str(graph.attributes["function_type"]).split("->", 1)[1])
    outputs = [
        TensorSig(name, *_parse_type(t))
        for t, name in zip(result_types, _names(graph.attributes["res_attrs"]))
        if t.startswith("tensor")
    ]
    writes = {name: 0 for _, name in handles}
    for inner in _walk(block):
        if inner.name == "coreai.write_handle":
            target = inner.operands[0]
            for arg, name in handles:
                if target == arg:
                    writes[name] += 1
    return GraphSignature(function, tuple(inputs), tuple(states), tuple(outputs), writes)


def _walk(block):
    for op in block.operations:
        o = op.operation
        yield o
        for region in o.regions:
            for inner in region.blocks:
                yield from _walk(inner)


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
    if problems:
        raise SsmportError("exported graph breaks the decode contract: " + "; ".join(problems))
