"""What an architecture provides, so a new SSM can be added from outside the package.

An architecture is one file that defines its config, its typed states, the plain fp32
reference step (the spec), the export-form decode module, the checkpoint mappings, the
synthetic-weight generator and its quantization predicate. Register an instance with
`ssmport.register_architecture` and every command (export, gate, logits, inspect, list)
works with it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from ssmport.checkpoint import TensorSource
from ssmport.quant.plan import WeightBuilder
from ssmport.state import StateSpec

# The decode graph's fixed interface (engines that always pass position_ids work too).
INPUT_NAMES = ("input_ids", "position_ids")
OUTPUT_NAMES = ("logits",)


class ArchConfig(Protocol):
    vocab_size: int

    def to_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Preset:
    name: str
    architecture: str
    config: Mapping[str, Any]  # keyword arguments of the architecture's config class
    description: str
    released: bool  # True: real weights exist (pass --weights, or --synthetic for a demo)


@dataclass
class LoadedModel:
    """An architecture, its config, and canonical-name weights ready to build from."""

    architecture: Architecture
    config: ArchConfig
    weights: TensorSource
    provenance: dict[str, Any]  # kind, path / preset / seed; copied into the manifest
    vocab_path: Path | None = None
    vocab_origin: str | None = None  # "next to checkpoint" | "--vocab" | "bundled ..."
    name: str = "model"
    notes: list[str] = field(default_factory=list)  # things the user should hear about

    @property
    def synthetic(self) -> bool:
        return self.provenance.get("kind") == "synthetic"


class ReferenceModel(Protocol):
    """The plain fp32 loop: readable, slow, the spec every other form is tested against."""

    def zero_state(self) -> Any: ...

    def step(self, token: int, state: Any) -> torch.Tensor:  # -> fp32 logits [V]
        ...


@dataclass
class Architecture(ABC):
    name: str  # Hugging Face `model_type`, e.g. "rwkv7"
    description: str
    hf_architectures: tuple[str, ...] = ()
    presets: tuple[Preset, ...] = field(default_factory=tuple)

    # --- configs -------------------------------------------------------------------
    @abstractmethod
    def config_from_json(self, data: Mapping[str, Any]) -> ArchConfig:
        """Rebuild a config from its `to_json()` form (manifests)."""

    # --- loading -------------------------------------------------------------------
    @abstractmethod
    def matches_pth(self, source: TensorSource) -> bool:
        """Whether a native `.pth` state dict looks like this architecture (by names)."""

    @abstractmethod
    def load_pth(self, source: TensorSource) -> tuple[ArchConfig, TensorSource]:
        """Config from tensor shapes, strict check, canonical-name view."""

    @abstractmethod
    def load_hf(self, config_json: Mapping[str, Any], source: TensorSource) -> tuple[ArchConfig, TensorSource]:
        """Config from `config.json`, strict check, canonical-name view."""

    @abstractmethod
    def synthetic_weights(self, config: ArchConfig, seed: int) -> TensorSource:
        """Deterministic random weights with plausible scales (generated on access)."""

    # --- the model -----------------------------------------------------------------
    @abstractmethod
    def state_specs(self, config: ArchConfig, state_dtype: torch.dtype) -> list[StateSpec]:
        """The Core AI states, in graph order."""

    @abstractmethod
    def build_decode(
        self, config: ArchConfig, weights: TensorSource, builder: WeightBuilder, state_dtype: torch.dtype
    ) -> nn.Module:
        """The export-form M=1 decode module.

        `forward(input_ids int32 [1,1], position_ids int32 [1,1]) -> logits [1,1,V]`; its
        mutated buffers are exactly `state_specs(...)`, each written once per call.
        """

    def build_prefill(self, config: ArchConfig, decode: nn.Module, chunk: int) -> nn.Module | None:
        """The export-form chunked prefill module, or None (the bundle is then decode-only).

        `forward(input_ids int32 [1,T], position_ids int32 [1,T], valid_len int32 [1])
        -> logits [1,1,V]` for T = `chunk`: the logits of token valid_len-1; tokens at
        t >= valid_len are padding and must leave every state untouched. It must reuse
        `decode`'s parameters (the same tensor objects: the two functions then share one
        copy of the weights in the asset), register the same `state_specs` and write each
        once. `ssmport.prefill` has the shared pieces (`scan`, `last_valid`);
        RWKV7Prefill is the worked example.
        """
        return None

    @abstractmethod
    def reference(self, config: ArchConfig, weights: TensorSource) -> ReferenceModel:
        """The plain fp32 reference loop."""

    def default_vocab(self, config: ArchConfig) -> tuple[Path, str] | None:
        """(vocab file, origin) to attach when none sits next to the checkpoint."""
        return None

    @abstractmethod
    def keeps_float(self, name: str) -> bool:
        """Quantization predicate: True for weights that must never be int8 under
        `int8keepproj` (the projections feeding the recurrence, LoRAs, ...)."""
