"""The bundle layouts ssmport writes, and the one place a layout's name is read into its object
(`layout_named`): the user's `--layout`, ExportOptions.layout, a manifest's "layout".

"ssmport" (the default, `SsmportLayout`): `main` takes one token per call ([1, 1] input_ids,
one position), `prefill` a fixed chunk of T rows padded past `valid_len` (ssmport.prefill),
`verify` K rows the same way (ssmport.verify); a model with KV caches gets their position axis
dynamic (ssmport.growing_kv). "apple": ssmport.apple.layout.
"""

from __future__ import annotations

import numpy as np
import torch

from ssmport.apple.layout import AppleLayout
from ssmport.architectures.base import INPUT_NAMES, OUTPUT_NAMES
from ssmport.errors import SsmportError
from ssmport.graph import CausalLM
from ssmport import growing_kv
from ssmport.layout import Function, Layout
from ssmport.prefill import PREFILL_FUNCTION, PREFILL_INPUT_NAMES, example_inputs
from ssmport.verify import VERIFY_FUNCTION, build_verify


class SsmportLayout(Layout):
    name = "ssmport"
    padding = "valid_len"
    held_back = 0

    def check_export(self, arch, prefill_chunk: int | None) -> None:
        longest = arch.max_prefill_chunk
        if prefill_chunk is not None and longest is not None and prefill_chunk > longest:
            raise SsmportError(f"--prefill-chunk {prefill_chunk}: {arch.name}'s chunkwise prefill is "
                               f"exact for chunks of up to {longest} tokens")  # fmt: skip

    def functions(self, arch, config, specs, decode, prefill, prefill_chunk, verify):
        checker = _verify_module(arch, decode, verify) if verify else None
        if growing_kv.grows(specs) and isinstance(decode, CausalLM):
            functions = []
            for name, lm, inputs in (("main", decode, INPUT_NAMES), (PREFILL_FUNCTION, prefill, PREFILL_INPUT_NAMES),
                                     (VERIFY_FUNCTION, checker, PREFILL_INPUT_NAMES)):  # fmt: skip
                if lm is not None:
                    module = growing_kv.GrowingKVLM(lm).eval()
                    example, dynamic = module.example()
                    functions.append(Function(name, module, example, inputs, OUTPUT_NAMES, dynamic))
            return functions, list(functions[0].module.specs)
        # two distinct tensors: torch.export merges an input passed twice into one placeholder
        example = (torch.zeros(1, 1, dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32))
        functions = [Function("main", decode, example, INPUT_NAMES, OUTPUT_NAMES)]
        if prefill is not None:
            functions.append(Function(PREFILL_FUNCTION, prefill, example_inputs(prefill_chunk), PREFILL_INPUT_NAMES,
                                      OUTPUT_NAMES))  # fmt: skip
        if checker is not None:
            functions.append(Function(VERIFY_FUNCTION, checker, example_inputs(verify), PREFILL_INPUT_NAMES,
                                      OUTPUT_NAMES))  # fmt: skip
        return functions, list(specs)

    def prefill_rows(self, arch, specs, prefill_chunk: int) -> int:
        return prefill_chunk

    def main_positions(self, first: int, n: int) -> np.ndarray:
        return np.array([first])

    def rows_inputs(self, chunk: list[int], first: int, rows: int) -> dict[str, np.ndarray]:
        ids = np.zeros((1, rows), dtype=np.int32)  # padding past valid_len never reaches a state
        ids[0, : len(chunk)] = chunk
        return {"input_ids": ids, "position_ids": np.arange(first, first + rows, dtype=np.int32).reshape(1, rows),
                "valid_len": np.array([len(chunk)], dtype=np.int32)}  # fmt: skip


def _verify_module(arch, decode: torch.nn.Module, k: int) -> torch.nn.Module:
    """The verify function's module (ssmport.verify), refused where the chunk path cannot take K rows."""
    longest = arch.max_prefill_chunk
    if longest is not None and k > longest:
        raise SsmportError(f"--verify {k}: {arch.name}'s chunkwise form is exact for up to {longest} tokens")
    module = build_verify(decode, k)
    if module is None:
        raise SsmportError(f"--verify: {arch.name} builds its own decode module, which has no verify form")
    return module.eval()


DEFAULT = SsmportLayout()
_LAYOUTS = {kind.name: kind for kind in (SsmportLayout, AppleLayout)}  # the manifest's LAYOUTS, in order
NAMES = tuple(_LAYOUTS)


def layout_named(layout: str | Layout, apple_main: str | None = None) -> Layout:
    """The layout `layout` names (or `layout` itself); `apple_main`: the form of the apple
    layout's `main` (ssmport.apple.graph; None: its default)."""
    if isinstance(layout, Layout):  # read already (dataclasses.replace of an ExportOptions, say)
        if apple_main is not None and getattr(layout, "main", None) != apple_main:
            raise SsmportError(f"--apple-main {apple_main}: the layout given is {layout!r}")
        return layout
    kind = _LAYOUTS.get(layout)
    if kind is None:
        raise SsmportError(f"unknown --layout {layout!r}; choose one of: {', '.join(NAMES)}")
    if apple_main is None:
        return kind()
    if kind is not AppleLayout:
        raise SsmportError("--apple-main applies to --layout apple only")
    return AppleLayout(apple_main)


__all__ = ["DEFAULT", "NAMES", "SsmportLayout", "layout_named"]
