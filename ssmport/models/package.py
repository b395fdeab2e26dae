"""The part of an `Architecture` that is the same for every built-in: each method hands over to
the function its package defines (config class, canonical shapes, synthetic init, build,
reference, roles). An architecture adds its loaders and its state specs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ssmport.architectures.base import Architecture
from ssmport.loader.checkpoint import GeneratedSource, TensorSource


@dataclass
class PackagedArchitecture(Architecture):
    config_class: type | None = None
    canonical_shapes: Callable[[Any], dict[str, tuple[int, ...]]] | None = None
    synthetic_init: Callable | None = None  # (name, shape, generator) -> tensor
    build: Callable | None = None  # (config, weights, builder) -> (embedding, blocks, head)
    reference_class: type | None = None
    role: Callable[[str], str] | None = None
    keep_float_roles: frozenset[str] = field(default_factory=frozenset)
    int8_safe_roles: frozenset[str] = field(default_factory=frozenset)

    def config_from_json(self, data: Mapping[str, Any]):
        return self.config_class(**data)

    def synthetic_weights(self, config, seed: int) -> TensorSource:
        return GeneratedSource(self.canonical_shapes(config), seed, self.synthetic_init)

    def build_blocks(self, config, weights, builder):
        return self.build(config, weights, builder)

    def reference(self, config, weights):
        return self.reference_class(config, weights)

    def keeps_float(self, name: str) -> bool:
        return self.role(name) in self.keep_float_roles

    def int8_safe(self, name: str) -> bool:
        return self.role(name) in self.int8_safe_roles


class Reference:
    """What every package's reference starts from: its config, and each canonical weight read
    once in fp32 (`shapes`: the package's canonical_shapes, as a staticmethod)."""

    shapes: Callable[[Any], dict[str, tuple[int, ...]]]

    def __init__(self, cfg, weights: TensorSource):
        self.cfg = cfg
        self.w = {name: weights[name].float() for name in self.shapes(cfg)}


def package_parts(config_class: type, reference_class: type, checkpoints, synthetic, block, quant) -> dict[str, Any]:
    """The keyword arguments of a `PackagedArchitecture` from its package's modules, which
    follow one naming: checkpoints.canonical_shapes, synthetic.synthetic_init, block.build,
    quant.role, quant.KEEP_FLOAT_ROLES and (optional) quant.INT8_SAFE_ROLES, quant.INT4_SAFE_EXPERTS."""
    return {"config_class": config_class, "reference_class": reference_class,
            "canonical_shapes": checkpoints.canonical_shapes, "synthetic_init": synthetic.synthetic_init,
            "build": block.build, "role": quant.role, "keep_float_roles": quant.KEEP_FLOAT_ROLES,
            "int8_safe_roles": getattr(quant, "INT8_SAFE_ROLES", frozenset()),
            "int4_safe_experts": getattr(quant, "INT4_SAFE_EXPERTS", False)}  # fmt: skip
