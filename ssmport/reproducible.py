"""What makes an export a function of its inputs: two exports of the same checkpoint with the
same options write byte-identical bundles, so users, caches and the Hub can deduplicate them
and a CI job can re-export a published bundle and compare.

Three things varied from run to run (measured on rwkv7-tiny, fp32 and int8keepproj):

* coreai names each instance of a deferred graph (`layer_norm`, `linalg_vector_norm`, ...)
  with a random 8-letter suffix (`layer_norm_iofpyteg`), drawn from `secrets`: the .mlirb's
  symbol table (and so main.hash) differed. `seeded_graph_names` draws the same kind of
  suffix from a fixed-seed generator while a program is converted: the same names, in the
  same order, for the same graph. The suffix only keeps instances apart in one module; the
  runtime never reads it.
* metadata.json: the asset writer stamps `creationDate` with the clock, and writes its keys
  in the order of a per-process hashed dictionary. `asset_metadata_json` rewrites it with
  sorted keys in the writer's own layout, and a creation date only where SOURCE_DATE_EPOCH
  (the reproducible-builds convention) gives one; the date is optional to Core AI
  (`AIModelAssetMetadata.creation_date: float | None`).
* the manifest's `bundle_id` (a uuid4) and the export's timings. The id is now the hash of
  the bundle's content (`content_id`), so a state snapshot still names the bundle it belongs
  to; the timings are recorded only by `export --profile-memory` (a measurement, not a
  reproducible build).

The weights' resource blobs are named by content (`deterministic_names`): LLVM names them with
a hash seeded by an address. The int4 recipes' 4-bit weights reach the converter packed two to
a byte (a uint8 array for an si4 tensor); they are named so too, with the native blob's bytes
and alignment (`_packed_sub_byte`; before, they kept the native name and int4 bundles differed).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import re
import string
from collections.abc import Iterator
from typing import Any

from ssmport.errors import SsmportError

_SUFFIX_LETTERS = 8  # coreai's own suffix length: tools that strip the suffix match it
# The coreai functions that name a graph instance, module by module (coreai-core 1.0.0b3).
_GRAPH_NAMERS = ("coreai.authoring.graph_builder", "coreai.authoring.func")
# Where coreai-torch's converter and coreai's `constant` find `create_elements_attr`.
_ATTR_MAKERS = ("coreai._compiler._mlir_libs._coreaiIR._bindings.mlir.dialects.coreai",
                "coreai._compiler.dialects.coreai.constant")  # fmt: skip
# create_elements_attr keeps a constant of fewer elements (and a splat) inline, and puts a
# larger one in a resource blob (measured: from 256 elements on, for f32, f16 and i8).
RESOURCE_FROM_ELEMENTS = 256
# The alignment create_elements_attr gives a blob of packed sub-byte elements (measured: 16;
# tests/test_reproducible.py compares the blobs).
PACKED_ALIGNMENT = 16


@contextlib.contextmanager
def deterministic_names(seed: int = 0) -> Iterator[None]:
    """Within this block, the names coreai gives while a program is built depend on the
    program alone: graph instances get suffixes from a generator seeded with `seed`, and a
    weight's resource blob is named after the sha256 of its bytes. Where a coreai release
    lacks these functions, nothing changes (tests/test_reproducible.py would say so)."""
    import importlib

    rng = random.Random(seed)

    def graph_name(base: str) -> str:
        return f"{base}_{''.join(rng.choice(string.ascii_lowercase) for _ in range(_SUFFIX_LETTERS))}"

    patched = []
    for module_name in _GRAPH_NAMERS:
        module = importlib.import_module(module_name)
        if hasattr(module, "_randomize_fn_name"):
            patched.append((module, "_randomize_fn_name", module._randomize_fn_name))
            module._randomize_fn_name = graph_name
    for module_name in _ATTR_MAKERS:
        module = importlib.import_module(module_name)
        if hasattr(module, "create_elements_attr"):
            original = module.create_elements_attr
            patched.append((module, "create_elements_attr", original))
            module.create_elements_attr = _content_named(original)
    try:
        yield
    finally:
        for module, name, original in reversed(patched):
            setattr(module, name, original)


def _content_named(create_elements_attr):
    """`create_elements_attr` whose resource blobs are named `w_<sha256 of bytes and type>`:
    the native one names them after an LLVM hash seeded by an address (ASLR), a new name in
    every process. A blob is made once per content and type and its attribute reused (one
    referenced at two types crashed the asset writer)."""
    import numpy as np
    from coreai._compiler.ir import DenseResourceElementsAttr

    made: dict[str, Any] = {}

    def create(loc, tensor_type, data):
        array = data if isinstance(data, np.ndarray) else None
        if (array is None or array.size < RESOURCE_FROM_ELEMENTS or array.min() == array.max()
                or not (_one_element_per_item(array, tensor_type) or _packed_sub_byte(array, tensor_type))):  # fmt: skip
            return create_elements_attr(loc, tensor_type, data)
        content = hashlib.sha256(memoryview(array).cast("B"))
        content.update(str(tensor_type).encode())
        name = f"w_{content.hexdigest()}"
        if name not in made:
            packed = {"alignment": PACKED_ALIGNMENT} if _packed_sub_byte(array, tensor_type) else {}
            try:
                made[name] = DenseResourceElementsAttr.get_from_buffer(array, name, tensor_type, context=loc.context, **packed)
            except ValueError:  # a buffer the binding cannot match to the type: the native way
                return create_elements_attr(loc, tensor_type, data)
        return made[name]

    return create


def _one_element_per_item(array, tensor_type) -> bool:
    """Whether `array` holds `tensor_type`'s elements one per item, as a resource blob stores
    them (ml_dtypes' bfloat16 goes the native way)."""
    from coreai._compiler.ir import ShapedType

    shaped = ShapedType(tensor_type)
    width = getattr(shaped.element_type, "width", None)
    return (array.dtype.kind in "fiu" and array.flags.c_contiguous and width == 8 * array.itemsize
            and array.size == math.prod(shaped.shape))  # fmt: skip


def _packed_sub_byte(array, tensor_type) -> bool:
    """Whether `array` is the bytes of `tensor_type`'s sub-byte elements packed whole, as the
    converter hands 4-bit weights over (coreai-torch's IntxTensor `.elem`: uint8, two elements a
    byte) and as a resource blob stores them (coreai-torch builds its own si4 blobs from such
    bytes; tests/test_reproducible.py checks the bytes equal the native blob's)."""
    from coreai._compiler.ir import ShapedType

    shaped = ShapedType(tensor_type)
    width = getattr(shaped.element_type, "width", None)
    return (array.dtype.kind == "u" and array.itemsize == 1 and array.flags.c_contiguous and width is not None and width < 8
            and 8 % width == 0 and array.size * 8 == width * math.prod(shaped.shape))  # fmt: skip


def _whole_bytes(tensor_type) -> bool:
    """Whether each element takes whole bytes. A folded constant of packed sub-byte elements
    keeps its native name: none was seen (rwkv7-tiny's int4keepproj bundle is reproducible; the
    converter's 4-bit weights are named in `_content_named`), so renaming one is untested."""
    from coreai._compiler.ir import ShapedType

    width = getattr(ShapedType(tensor_type).element_type, "width", None)
    return width is not None and width % 8 == 0


# Larger folded constants keep the native name (printing one as hex costs twice its size).
FOLDED_RENAME_LIMIT = 1 << 20
_NATIVE_RESOURCE = re.compile(r"dense_resource<(resource_[0-9]+)>")


def name_folded_constants(program) -> None:
    """Rename, by the sha256 of their bytes, the resource blobs coreai's own passes made while
    converting (constants folded in C++, such as a prefill chunk's 64x64 masks), which
    `deterministic_names` cannot reach. A blob's bytes are read by printing a module holding
    only its constant (the MLIR bindings have no other way to them)."""
    from coreai._compiler.ir import DenseResourceElementsAttr, InsertionPoint, Module, WalkResult

    module = program._module._mlir_module  # coreai-core 1.0.0b3's AIProgram (pinned)
    folded = []

    def visit(op):
        if op.name == "coreai.constant" and "value" in op.attributes:
            value = op.attributes["value"]
            if _NATIVE_RESOURCE.match(str(value)) and _whole_bytes(value.type):
                folded.append(op)
        return WalkResult.ADVANCE

    module.operation.walk(visit)
    made: dict[str, Any] = {}  # one blob per content and type, as natively
    for op in folded:
        tensor_type = op.attributes["value"].type
        with module.context, op.location:
            scratch = Module.create()
            with InsertionPoint(scratch.body):
                op.clone()
            text = str(scratch)
        found = re.search(r'resource_[0-9]+: "0x([0-9A-Fa-f]+)"', text)
        if found is None or len(found.group(1)) > 2 * FOLDED_RENAME_LIMIT:
            continue
        blob = bytes.fromhex(found.group(1))  # a blob prints as its alignment (4 bytes LE), then its data
        alignment, data = int.from_bytes(blob[:4], "little"), blob[4:]
        name = f"f_{hashlib.sha256(data + str(tensor_type).encode()).hexdigest()}"
        if name not in made:
            with module.context:
                made[name] = DenseResourceElementsAttr.get_from_buffer(bytearray(data), name, tensor_type,
                                                                       alignment=alignment)  # fmt: skip
        op.attributes["value"] = made[name]


def creation_date() -> float | None:
    """SOURCE_DATE_EPOCH as a Unix time, or None (no date recorded)."""
    value = os.environ.get("SOURCE_DATE_EPOCH")
    if value is None or value == "":
        return None
    if not value.isdigit():
        raise SsmportError(f"SOURCE_DATE_EPOCH={value!r} is not a Unix time (a whole number of seconds)")
    return float(value)


def asset_metadata_json(metadata: dict[str, Any]) -> str:
    """The asset's metadata.json text with its keys sorted, in the layout of the asset
    writer's pretty printer (two spaces, `"key" : value`), so that the file depends on its
    content alone."""
    return json.dumps(metadata, indent=2, sort_keys=True, separators=(",", " : "), ensure_ascii=False)


def content_id(manifest_json: dict[str, Any]) -> str:
    """A bundle's id: the sha256 (32 hex digits, a uuid's length) of its manifest's content
    at export, which names every file of the asset and the tokenizer by hash."""
    canonical = json.dumps(manifest_json, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]
