"""What an architecture provides, so a new SSM can be added from outside the package.

An architecture is one file that defines its config, its typed states, the plain fp32
reference step (the spec), the export-form decode module, the checkpoint mappings, the
synthetic-weight generator and its quantization predicate. Register an instance with
`ssmport.register_architecture` and every command (export, gate, logits, inspect, list)
works with it; `ssmport.testing.check_architecture` then checks the contract every
architecture must meet. The built-in architectures are written exactly this way.

Walkthrough: docs/adding-an-architecture.md (built on examples/xlstm.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, Required, TypedDict

import torch
from torch import nn

from ssmport.loader.checkpoint import TensorSource
from ssmport.errors import CheckpointError, SsmportError
from ssmport.quant.plan import WeightBuilder
from ssmport.state import StateSpec

# The decode graph's fixed interface (engines that always pass position_ids work too).
INPUT_NAMES = ("input_ids", "position_ids")
OUTPUT_NAMES = ("logits",)


class ArchConfig(Protocol):
    """What ssmport needs of an architecture's config (a frozen dataclass, typically).

    `to_json()` must return JSON-serialisable data that `Architecture.config_from_json`
    turns back into an equal config: manifests store it, and gates rebuild from it.
    """

    vocab_size: int

    def to_json(self) -> dict[str, Any]: ...


class FieldsConfig:
    """Mixed into a config dataclass whose JSON form is its fields (nested dataclasses as dicts)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class HubSource:
    """Where a released preset's checkpoint lives on the Hugging Face Hub."""

    repo: str  # "org/name"
    file: str | None = None  # a single-file checkpoint (.pth) in the repo; None: the repo is a model folder
    revision: str | None = None  # None: the repo's default branch (the manifest records the commit)
    confirmed: str | None = None  # how the repo (and file) were confirmed; None: not confirmed


@dataclass(frozen=True)
class Preset:
    """A named config: `ssmport export <name>` (downloaded from `hub`, with --weights, or
    synthetic weights).

    `released=False` presets export with synthetic weights and need no flag (demos, tests).
    """

    name: str
    architecture: str
    config: Mapping[str, Any]  # keyword arguments of the architecture's config class
    description: str
    released: bool  # True: real weights exist (downloaded, --weights, or --synthetic for a demo)
    hub: HubSource | None = None  # where `ssmport export <name>` downloads them from


class Provenance(TypedDict, total=False):
    """Where a `LoadedModel`'s weights come from. The exporter copies it into the manifest's
    `source`; `ssmport inspect` prints it and `gate` / `logits --backend torch` rebuild the
    fp32 source from it. Only `kind` is required: a hand-built model may give just that."""

    kind: Required[str]  # "synthetic" | "pth" | "hf" (or a hand-built model's own word)
    preset: str  # the preset it was loaded as
    seed: int  # the synthetic weights' seed
    path: str  # the checkpoint file or folder, resolved
    hub: dict[str, Any]  # {"repo", "commit", "file"}: the Hub copy it was downloaded as
    context: int  # --context, the positions its KV caches hold
    weights_probe: dict[str, Any]  # a few values of small tensors: is a rebuilt source the same?
    skipped_tensors: dict[str, Any]  # checkpoint tensors left out on purpose (a vision tower)
    plugin: str  # the --plugin its architecture was registered by (recorded at export)


@dataclass
class LoadedModel:
    """An architecture, its config, and canonical-name weights ready to build from."""

    architecture: Architecture
    config: ArchConfig
    weights: TensorSource
    provenance: Provenance  # copied into the manifest's `source`
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
    """Base class of every architecture, built-in or not.

    Subclass it in one file, create one instance and pass it to
    `ssmport.register_architecture`. Required: `config_from_json`, `synthetic_weights`,
    `state_specs`, `build_decode`, `reference`, `keeps_float`, and at least one loader
    (`load_hf` for Hugging Face folders, `matches_pth` + `load_pth` for single-file
    checkpoints). Optional: `default_vocab`.

    Attributes:
        name: the Hugging Face `model_type` ("rwkv7"); an HF folder whose config.json has
            this `model_type` (or one of `hf_architectures`) is loaded by this architecture.
        description: one line, shown by `ssmport list`.
        hf_architectures: config.json `architectures` entries that also select it.
        presets: named configs (`ssmport export <preset>`); names are global.
        tiny_preset: the name of one of `presets` small enough to export and gate in a few
            seconds: `ssmport.testing.check_architecture` and the built-in contract tests
            use it. None: the architecture declares no tiny config.
        max_prefill_chunk: the longest `--prefill-chunk` its prefill form is exact for (None:
            no limit of its own).
        preset_keys: the config fields a checkpoint must share with a preset it is exported
            as (`ssmport export PRESET --weights FILE`): the dimensions that make it that
            model. Fields the weights decide (LoRA ranks) or the export chooses (context) are
            left out.
    """

    name: str  # Hugging Face `model_type`, e.g. "rwkv7"
    description: str
    hf_architectures: tuple[str, ...] = ()
    presets: tuple[Preset, ...] = field(default_factory=tuple)
    tiny_preset: str | None = None
    max_prefill_chunk: int | None = None  # the longest prefill chunk its chunkwise forms are exact for
    preset_keys: tuple[str, ...] = ("vocab_size",)

    # --- configs -------------------------------------------------------------------
    @abstractmethod
    def config_from_json(self, data: Mapping[str, Any]) -> ArchConfig:
        """Rebuild a config from its `to_json()` form (manifests, presets' `config`)."""

    # --- loading -------------------------------------------------------------------
    def matches_hf_config(self, config_json: Mapping[str, Any]) -> bool:
        """Whether a checkpoint folder's `config.json` is this architecture's. By default its
        `model_type` or `architectures`; override for configs that carry neither (mamba_ssm)."""
        hf_arch = set(config_json.get("architectures") or [])
        return config_json.get("model_type") == self.name or bool(hf_arch & set(self.hf_architectures))

    def matches_pth(self, source: TensorSource) -> bool:
        """Whether a native `.pth` state dict looks like this architecture (by tensor names).

        Only names and shapes may be inspected (no data is read). Default: never.
        """
        return False

    def load_pth(self, source: TensorSource) -> tuple[ArchConfig, TensorSource]:
        """Config from tensor shapes, strict check, canonical-name view.

        Called only when `matches_pth` said yes. Raise `CheckpointError` naming every
        missing / unexpected / misshaped tensor at once (`ssmport.loader.checkpoint.check_strict`).
        """
        raise CheckpointError(f"{source.origin}: {self.name} has no loader for single-file checkpoints")

    def load_hf(self, config_json: Mapping[str, Any], source: TensorSource) -> tuple[ArchConfig, TensorSource]:
        """Config from `config.json`, strict check, canonical-name view.

        `source` holds the folder's tensors under their Hugging Face names (safetensors or
        pytorch_model.bin, sharded or not, read lazily). Return the config and a
        `TensorSource` under the architecture's canonical names, usually a
        `ssmport.loader.checkpoint.MappedSource` (renames and transposes applied on read), after
        `check_strict` has compared every name and shape. Unsupported config options must
        raise `CheckpointError` rather than be ignored.
        """
        raise CheckpointError(f"{source.origin}: {self.name} has no loader for Hugging Face folders")

    @abstractmethod
    def synthetic_weights(self, config: ArchConfig, seed: int) -> TensorSource:
        """Deterministic random weights with plausible scales, under canonical names.

        The same (config, seed) must give the same tensors: gates of synthetic bundles
        rebuild their reference from the seed. Big configs should generate on access.
        """

    # --- the model -----------------------------------------------------------------
    @abstractmethod
    def state_specs(self, config: ArchConfig, state_dtype: torch.dtype) -> list[StateSpec]:
        """The Core AI states, in graph order: the one place their names, shapes, dtypes
        and layouts are defined (the export, the runner, the manifest and the tests read it).

        Every spec takes `state_dtype` (fp32 or fp16 storage, `--state-dtype`); the
        recurrence itself should compute in fp32 whatever the storage dtype.
        """

    def build_blocks(
        self, config: ArchConfig, weights: TensorSource, builder: WeightBuilder
    ) -> tuple[nn.Module, list[nn.Module], nn.Module] | None:
        """The export form as parts of the generic graph (ssmport.graph.CausalLM): (embedding,
        one block per layer, head). With it, `build_decode` and `build_prefill` come for free;
        the built-in architectures are written this way. Default: None (override
        `build_decode` instead)."""
        return None

    def build_decode(
        self, config: ArchConfig, weights: TensorSource, builder: WeightBuilder, state_dtype: torch.dtype
    ) -> nn.Module:
        """The export-form M=1 decode module: by default `ssmport.graph.CausalLM` over
        `build_blocks`.

        `forward(input_ids int32 [1,1], position_ids int32 [1,1]) -> logits [1,1,V]`; its
        mutated buffers are exactly `state_specs(...)`, each written once per call.

        Rules that keep the export contract: request every weight from `builder`
        (`matmul` for `x @ W` with W [in, out], `table` for embeddings, `vector` for
        per-channel fp32 operands) so quantization and the manifest's plan see it; declare
        the states with `ssmport.state.register_states(self, specs)`; read a layer's slice
        with `read_layer` and write each state once with `write_once` (Apple's GPU delegate
        keeps one write per state); give the head `out_dtype=builder.recipe.logits_dtype`.
        """
        parts = self.build_blocks(config, weights, builder)
        if parts is None:
            raise NotImplementedError(f"{self.name}: implement build_blocks (or build_decode)")
        from ssmport.graph import CausalLM

        return CausalLM(*parts, self.state_specs(config, state_dtype))

    def build_prefill(self, config: ArchConfig, decode: nn.Module, chunk: int) -> nn.Module | None:
        """The export-form chunked prefill module, or None (the bundle is then decode-only).

        `forward(input_ids int32 [1,T], position_ids int32 [1,T], valid_len int32 [1])
        -> logits [1,1,V]` for T = `chunk`: the logits of token valid_len-1; tokens at
        t >= valid_len are padding and must leave every state untouched. It must reuse
        `decode`'s parameters (the same tensor objects: the two functions then share one
        copy of the weights in the asset), register the same `state_specs` and write each
        once. Default: the generic graph's prefill over the decode module's own blocks (when
        `build_decode` is the generic one), else None.
        """
        from ssmport.graph import CausalLM

        if isinstance(decode, CausalLM):
            return CausalLM(decode.embed, decode.layers, decode.head, decode.specs, chunk=chunk)
        return None

    # The skipped-tensor group (`provenance["skipped_tensors"]` key, "prefix*") that build_draft's
    # head is made of: a bundle carrying the head no longer lists it as skipped.
    draft_tensors = None

    def build_draft(self, config: ArchConfig, weights: TensorSource, builder: WeightBuilder, decode: nn.Module,
                    rows: int, state_dtype: torch.dtype) -> nn.Module | None:  # fmt: skip
        """The checkpoint's own draft head as a function of `rows` rows over `decode`'s weights
        (Qwen3.5's MTP head: ssmport.models.qwen3_5.mtp), or None (the default: none)."""
        return None

    def with_context(self, config: ArchConfig, context: int) -> ArchConfig:
        """The config with its KV cache sized for `context` positions (`--context`). Only an
        architecture with kv states has one; the default refuses."""
        raise SsmportError(f"--context sizes a KV cache, and {self.name} has none (its state does not grow with the "
                           "sequence)")  # fmt: skip

    @abstractmethod
    def reference(self, config: ArchConfig, weights: TensorSource) -> ReferenceModel:
        """The plain fp32 reference loop, written for reading: the spec `build_decode` is
        tested against (`zero_state()`, then `step(token, state) -> logits [V]`)."""

    def apple_state_splits(self, config: ArchConfig) -> list | None:
        """How the apple layout stores this architecture's states (`ssmport.state.StateSplit`:
        a native state kept as parts, e.g. so a pure-recurrent model has three states; [] keeps
        them as they are). None: no apple layout (its chunk forms must be loop-free and
        shape-polymorphic in T first). Default: None."""
        return None

    def default_vocab(self, config: ArchConfig) -> tuple[Path, str] | None:
        """Tokenizer hook: (vocab file, origin) to attach when none sits next to the
        checkpoint or was given with --vocab. Default: none."""
        return None

    @abstractmethod
    def keeps_float(self, name: str) -> bool:
        """Quantization predicate: True for weights that must never be int8 under
        `int8keepproj` (the projections feeding the recurrence, LoRAs, ...).

        `name` is the name given to `builder.matmul` (a canonical weight name)."""

    def int8_safe(self, name: str) -> bool:
        """Of the weights `keeps_float` keeps: those measured harmless at int8 next to a 4-bit
        bulk, which `int4keepproj` stores as int8 instead of 16-bit. Default: none."""
        return False

    # Routed experts measured safe at 4 bits on trained weights: `int4keepproj` then stores them
    # as its bulk (4 bits) rather than at its `expert_bits` floor (8). Default: not measured.
    int4_safe_experts: bool = False
