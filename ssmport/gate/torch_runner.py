"""The torch side of every comparison: the export-form decode module run eagerly.

It has the same `reset / step / feed` interface as the Core AI `Runner`, so gates and
`ssmport logits --backend torch` treat both alike. The fp32 build of this module is tied to
the plain reference loop by the tests, and the loop to independent implementations.
"""

from __future__ import annotations

import numpy as np
import torch

from ssmport.architectures import LoadedModel
from ssmport.errors import SsmportError
from ssmport.quant import Recipe, get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.quant.tied import store_tied_table_once
from ssmport.state import KV, check_room, zero_states


class TorchRunner:
    def __init__(self, model: LoadedModel, recipe: str | Recipe = "fp32", state_dtype: torch.dtype = torch.float32):
        arch = model.architecture
        self.builder = WeightBuilder.for_architecture(get_recipe(recipe), arch)
        with torch.no_grad():
            self.module = arch.build_decode(model.config, model.weights, self.builder, state_dtype).eval()
            store_tied_table_once(self.module, self.builder)  # as the export stores the recipe's weights
        self.specs = arch.state_specs(model.config, state_dtype)
        self.vocab_size = model.config.vocab_size
        # The positions its kv states hold (None: no kv state, any length), as the Runner's.
        self.context: int | None = min((s.context for s in self.specs if s.kind == KV), default=None)
        self.tokens: list[int] = []

    def reset(self) -> None:
        zero_states(self.module, self.specs)
        self.tokens = []

    def step(self, token: int) -> np.ndarray:
        if not 0 <= int(token) < self.vocab_size:
            raise SsmportError(f"token id {token} is outside the vocabulary [0, {self.vocab_size})")
        check_room(len(self.tokens), 1, self.context)
        ids = torch.tensor([[token]], dtype=torch.int32)
        pos = torch.tensor([[len(self.tokens)]], dtype=torch.int32)
        with torch.no_grad():
            logits = self.module(ids, pos)
        self.tokens.append(int(token))
        return logits.float().reshape(-1).numpy().copy()

    def step_each(self, tokens: list[int]) -> np.ndarray:
        """The logits after each token, float32 [T, V]."""
        rows = [self.step(t) for t in tokens]
        return np.stack(rows) if rows else np.zeros((0, self.vocab_size), np.float32)

    def feed(self, tokens: list[int]) -> np.ndarray:
        """The logits after the last token, float32 [V] (always the M=1 loop: the reference)."""
        if not tokens:
            raise SsmportError("feed needs at least one token")
        return self.step_each(tokens)[-1]

    def close(self) -> None:
        del self.module
