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
_GRAPH = re.compile(r"coreai\.graph @(\w+)\((.*?)\) -> \((.*?)\) attributes", re.S)
_ARG = re.compile(r'%(\w+): (!coreai\.handle<)?tensor<([^>]*)>>? \{([^}]*)\}')
_RESULT = re.compile(r'(?:tensor<([^>]*)>|!coreai\.token) \{coreai\.name = "([^"]+)"\}')
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
    *dims, elem = text.split("x")
    return tuple(int(d) for d in dims), _IR_DTYPES.get(elem, elem)


def program_ir(program) -> str:
    """The program's text with large constants elided (safe to build for a 3B model)."""
    return program._module._mlir_module.operation.get_asm(large_elements_limit=16)


def parse_signature(ir: str, function: str = "main") -> GraphSignature:
    for m in _GRAPH.finditer(ir):
        if m.group(1) == function:
            break
    else:
        raise SsmportError(f"graph @{function} not found in the converted program")
    inputs, states, handles = [], [], {}
    for arg in _ARG.finditer(m.group(2)):
        ssa, is_handle, type_text, attrs = arg.groups()
        name = _NAME.search(attrs).group(1)
        sig = TensorSig(name, *_parse_type(type_text))
        if is_handle:
            states.append(sig)
            handles[ssa] = name
        else:
            inputs.append(sig)
    outputs = [
        TensorSig(name, *_parse_type(type_text)) for type_text, name in _RESULT.findall(m.group(3)) if type_text
    ]
    body = ir[m.end():]
    writes = {name: len(re.findall(rf"coreai\.write_handle %{ssa}\b", body)) for ssa, name in handles.items()}
    return GraphSignature(function, tuple(inputs), tuple(states), tuple(outputs), writes)


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
