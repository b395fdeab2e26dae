"""What a bundle layout is: the one object that says how a bundle's functions look and are driven.

A layout is chosen once (ssmport.layouts.layout_named: from `--layout` / ExportOptions.layout
at export, from the manifest's "layout" when a bundle is opened) and then asked, never
compared by name:

- at export: which functions to convert over the decode module's blocks (`functions`), the
  rows the manifest's prefill entry records (`prefill_rows`) and its padding, the checks its
  options need (`check_export`), and any files beside ssmport's own (`write_files`);
- at run time (ssmport.runtime.runner): the calling convention: the positions `main` takes
  (`main_positions`), the inputs of a call over rows (`rows_inputs`), and how a prompt is cut
  into calls (`prompt_calls`).

The two layouts: the default "ssmport" layout (ssmport.layouts.SsmportLayout: `main` [1, 1] plus
padded prefill chunks) and Apple's (ssmport.apple.layout.AppleLayout: the functions, states and
files Apple's engines load and drive).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAIN_CALL = "main"
PREFILL_CALL = "prefill"


@dataclass
class Function:
    """One function of the program to convert: its module, tracing inputs, I/O names and
    torch.export's dynamic shapes (None: all static)."""

    name: str
    module: Any  # torch.nn.Module
    example: tuple
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    dynamic_shapes: tuple | None = None
    states: list | None = None  # its own states (a draft head's); None: the layout's


class Layout(ABC):
    name: str  # the manifest's "layout" value
    padding: str  # the manifest's prefill / verify "padding": how a short call is fed
    held_back: int  # the prompt tokens `main` takes after `prefill` (the rest go through prefill)

    def check_export(self, arch, prefill_chunk: int | None) -> None:
        """Refuse export options this layout cannot honour, before any checkpoint is converted."""

    @abstractmethod
    def functions(self, arch, config, specs, decode, prefill, prefill_chunk: int | None,
                  verify: int | None) -> tuple[list[Function], list]:  # fmt: skip
        """The functions to convert over the decode module (and the generic prefill module, or
        None for a decode-only bundle; `specs`: the architecture's states), and the states they
        carry, in order; `verify` K: a verify function of K rows too."""

    @abstractmethod
    def prefill_rows(self, arch, specs, prefill_chunk: int) -> int:
        """The manifest's prefill "chunk": the most tokens one prefill call takes."""

    def write_files(self, out: Path, manifest, model) -> None:
        """Files the layout's consumers read beside the asset and ssmport's manifest."""

    @abstractmethod
    def main_positions(self, first: int, n: int) -> np.ndarray:
        """`main`'s position_ids for n tokens after `first` held ones."""

    @abstractmethod
    def rows_inputs(self, chunk: list[int], first: int, rows: int) -> dict[str, np.ndarray]:
        """The inputs of one call of a function over rows (prefill, verify) on `chunk` after
        `first` held tokens; `rows`: the function's row count."""

    def prompt_calls(self, tokens: list[int], prefill_chunk: int | None,
                     main_rows: int) -> list[tuple[str, list[int]]]:  # fmt: skip
        """A prompt as calls, (MAIN_CALL | PREFILL_CALL, tokens) in order; `prefill_chunk` None:
        no prefill function (or it is turned off); `main_rows`: the most tokens `main` takes.
        The logits of the last call are the prompt's."""
        if prefill_chunk is None:
            return [(MAIN_CALL, tokens[s : s + main_rows]) for s in range(0, len(tokens), main_rows)]
        head, tail = tokens[: len(tokens) - self.held_back], tokens[len(tokens) - self.held_back :]
        calls = [(PREFILL_CALL, head[s : s + prefill_chunk]) for s in range(0, len(head), prefill_chunk)]
        return calls + [(MAIN_CALL, tail)] * bool(tail)

    def __repr__(self) -> str:
        return f"<layout {self.name}>"
