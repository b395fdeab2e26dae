"""The apple layout (ssmport.layout.Layout): the functions, states and files Apple's engines
load and drive (docs/apple-engines.md).

`main` takes one token per call (the "decode" form) or up to `prefill`'s rows ("chunk", which the
86b363d engines need), `prefill` any number of rows up to its bound, without padding and without
outputs; `position_ids` carries the whole history (ssmport.apple.graph); a prompt goes through
`prefill` but for its last token, which `main` takes, as Apple's engines feed it.
"""

from __future__ import annotations

import numpy as np

from ssmport.apple import export as apple
from ssmport.apple.graph import APPLE_MAINS, DECODE_MAIN
from ssmport.errors import SsmportError
from ssmport.layout import Function, Layout
from ssmport.verify import VERIFY_FUNCTION


class AppleLayout(Layout):
    name = "apple"
    padding = "none"
    held_back = 1  # Apple's engines feed all but the last prompt token through prefill

    def __init__(self, main: str = DECODE_MAIN):
        if main not in APPLE_MAINS:
            raise SsmportError(f"unknown --apple-main {main!r}; choose one of: {', '.join(APPLE_MAINS)}")
        self.main = main

    def functions(self, arch, config, specs, decode, prefill, prefill_chunk, verify):
        main, prefill = apple.apple_modules(arch, config, decode, prefill is not None, self.main)
        checker = apple.verify_module(arch, config, decode, verify) if verify else None
        functions = []
        for name, module in ((apple.MAIN, main), (apple.PREFILL, prefill), (VERIFY_FUNCTION, checker)):
            if module is not None:
                example, dynamic = apple.example_and_shapes(module)
                outputs = apple.OUTPUT_NAMES[apple.MAIN if name == VERIFY_FUNCTION else name]
                functions.append(Function(name, module, example, apple.INPUT_NAMES, outputs, dynamic))
        return functions, list(main.specs)

    def prefill_rows(self, arch, specs, prefill_chunk: int) -> int:
        return apple.max_rows(arch, specs)

    def write_files(self, out, manifest, model) -> None:
        apple.write_files(out, manifest, model)

    def main_positions(self, first: int, n: int) -> np.ndarray:
        return np.arange(first + n)  # the whole history

    def rows_inputs(self, chunk: list[int], first: int, rows: int) -> dict[str, np.ndarray]:
        # no padding, the whole history as positions, no outputs
        return {"input_ids": np.array([chunk], dtype=np.int32),
                "position_ids": np.arange(first + len(chunk), dtype=np.int32).reshape(1, -1)}  # fmt: skip

    def __repr__(self) -> str:
        return f"<layout apple, main {self.main}>"


__all__ = ["AppleLayout"]
