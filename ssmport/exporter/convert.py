"""Build the export-form modules under a recipe and convert them to one Core AI program.

    build the decode module (and the generic prefill module) from the checkpoint, weight by
    weight under the recipe's WeightBuilder
    -> the layout's functions over them (ssmport.layout)
    -> torch.export -> run_decompositions(get_decomp_table())
    -> TorchConverter (RELEASE, explicit input/output/state names; each weight freed once copied)
    -> every function's signature read back from the IR and checked (ssmport.exporter.contract)
"""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from ssmport._quiet import python_stdout_captured
from ssmport.architectures import LoadedModel
from ssmport.errors import SsmportError
from ssmport.exporter.contract import GraphSignature, check_contract, read_signature
from ssmport.layout import Function, Layout
from ssmport.layouts import DEFAULT as DEFAULT_LAYOUT
from ssmport.layouts import layout_named
from ssmport.memory import return_freed_memory, section, trim_heap
from ssmport.models.moe import GATHERED, use_expert_form
from ssmport.prefill import DEFAULT_CHUNK, PREFILL_FUNCTION
from ssmport.progress import Stages
from ssmport.quant.plan import WeightBuilder, storage_key
from ssmport.quant.tied import store_tied_table_once
from ssmport.reproducible import deterministic_names, name_folded_constants
from ssmport.verify import DRAFT_FUNCTION, DRAFT_INPUT_NAMES, DRAFT_OUTPUT_NAMES, HIDDEN_OUTPUT, VERIFY_FUNCTION


@dataclass
class Converted:
    """A converted program and the signatures read back from its IR (checked)."""

    program: Any
    decode: GraphSignature
    prefill: GraphSignature | None  # None: a decode-only program
    prefill_chunk: int | None
    specs: list  # the states of both functions, as the layout stores them
    layout: Layout = DEFAULT_LAYOUT
    verify: GraphSignature | None = None  # with --verify: the function checking K drafts
    verify_rows: int | None = None
    draft: GraphSignature | None = None  # the checkpoint's draft head (Qwen3.5's MTP), with its own states
    draft_specs: list | None = None
    parameters: int = 0  # the checkpoint's weights, counted: how much freeing memory is worth


def convert(
    model: LoadedModel,
    builder: WeightBuilder,
    state_dtype: torch.dtype,
    stages: Stages | None = None,
    prefill_chunk: int | None = DEFAULT_CHUNK,
    layout: str | Layout = DEFAULT_LAYOUT,
    verify: int | None = None,
    experts: str = GATHERED,
    require_tied_table: bool = False,
) -> Converted:
    """Build the decode module (and the prefill module, when the architecture has one and
    `prefill_chunk` is set) under `builder`'s recipe and convert them to one Core AI program:
    function "main" and function "prefill", sharing the weights, in `layout`'s form
    (ssmport.layout; a name is read by ssmport.layouts.layout_named): "apple", the functions
    Apple's engines drive (ssmport.apple.graph), over the same blocks.

    `verify` K: a third function, "verify", checking K drafted tokens per call (ssmport.verify).
    `experts`: how the decode function reads a token's routed experts (ssmport.models.moe.EXPERT_FORMS).
    `require_tied_table` (--int8-tied-table): a head that is not the embedding table is refused
    once the weights are built, not after the (far longer) export and conversion.

    Every function's signature is read from the IR and checked against the contract.
    """
    stages = stages or Stages(enabled=False)
    layout = layout_named(layout)
    arch, cfg = model.architecture, model.config
    specs = arch.state_specs(cfg, state_dtype)
    _check_verify_fits(verify, specs)
    total = sum(math.prod(model.weights.shape(n)) for n in model.weights)
    with stages.stage("Building weights", total=total), _releasing_pages(model.weights, builder):
        with torch.no_grad():
            module = arch.build_decode(cfg, model.weights, builder, state_dtype).eval()
            if not store_tied_table_once(module, builder) and require_tied_table:
                raise SsmportError(f"--int8-tied-table: {model.name}'s LM head is not its embedding table (an untied "
                                   "head), so there is no table to read from it")  # fmt: skip
            use_expert_form(module, experts)
            prefill = arch.build_prefill(cfg, module, prefill_chunk) if prefill_chunk else None
            draft = arch.build_draft(cfg, model.weights, builder, module, verify, state_dtype) if verify else None
    check_buffers(module, specs)
    if prefill is not None:
        prefill.eval()
        check_buffers(prefill, specs)
    functions, specs = layout.functions(arch, cfg, specs, module, prefill, prefill_chunk, verify)
    if draft is not None:
        _add_draft(functions, draft, model)
    del module, prefill, draft
    return_freed_memory(total)  # the fp32 temporaries of building; keeps the conversion peak low

    with stages.stage("torch.export"):
        programs = [_export_program(f.module, f.example, f.name, f.dynamic_shapes) for f in functions]
        # torch.export of a while_loop (ops.scan) goes through dynamo, whose code cache then keeps the
        # traced module (and so every weight) alive after the export is done.
        torch._dynamo.reset()
        # The programs hold the weights from here on. Converting a program repacks each 4-bit
        # matmul's int8 levels into a copy of its own (coreai-torch's sub-byte pass), so a module
        # kept alive here would hold the int8 levels beside both functions' packed ones.
        for f in functions:
            f.module = None

    with stages.stage("Converting to Core AI"):
        with python_stdout_captured(), deterministic_names():  # the same graph, the same names
            converter = _releasing_converter(builder, model.weights.storage_keys())
            for f, ep in zip(functions, programs):
                with section(f"add_exported_program {f.name}"):
                    converter = converter.add_exported_program(
                        ep, input_names=list(f.inputs), output_names=list(f.outputs),
                        state_names=[s.name for s in (specs if f.states is None else f.states)],
                        **({} if f.name == "main" else {"entrypoint_name": f.name}),
                    )  # fmt: skip
                    return_freed_memory(total)  # its sub-byte pass's temporaries (~1 GB at a 248,320-row int4 head)
            with section("TorchConverter.to_coreai"):
                program = converter.to_coreai()
            name_folded_constants(program)
        contracts = [(f.name, f.inputs, f.outputs, specs if f.states is None else f.states) for f in functions]
        draft_specs = next((f.states for f in functions if f.name == DRAFT_FUNCTION), None)
        with section("release torch module"):
            del functions, programs, converter
            return_freed_memory(total)
            model.weights.release_pages()  # a checkpoint's fp32 tensors are stored as they are: re-read here
        signatures = {}
        with section("read IR signature"):
            for name, inputs, outputs, states in contracts:
                signatures[name] = read_signature(program, name)
                check_contract(signatures[name], inputs, outputs, states)
    prefill_sig = signatures.get(PREFILL_FUNCTION)
    chunk = None if prefill_sig is None else layout.prefill_rows(arch, specs, prefill_chunk)
    verify_sig = signatures.get(VERIFY_FUNCTION)
    return Converted(program, signatures["main"], prefill_sig, chunk, specs, layout, verify_sig,
                     verify if verify_sig is not None else None, signatures.get(DRAFT_FUNCTION), draft_specs, total)  # fmt: skip


def _add_draft(functions: list[Function], draft: torch.nn.Module, model: LoadedModel) -> None:
    """The draft head as one more function (its own states), and the target's functions with the
    hidden output it drafts from. The apple layout's functions are Apple's engines' signatures:
    there the head is left out, said in a note."""
    from ssmport.growing_kv import GrowingKVLM

    if not all(isinstance(f.module, GrowingKVLM) for f in functions):
        model.notes.append("the checkpoint's draft head (multi-token prediction) is not exported in this layout: its "
                           "draft function needs hidden-state outputs that Apple's engines' functions do not have")  # fmt: skip
        return
    for f in functions:
        f.module.hidden = True
        f.outputs = (*f.outputs, HIDDEN_OUTPUT)
    functions.append(Function(DRAFT_FUNCTION, draft, draft.example(), DRAFT_INPUT_NAMES, DRAFT_OUTPUT_NAMES,
                              states=list(draft.specs)))  # fmt: skip


def _check_verify_fits(k: int | None, specs) -> None:
    """A verify call writes its K rows into the KV cache: K beyond the cache's positions could
    never be fed (and the apple layout's function would take fewer rows than the manifest says)."""
    context = min((s.context for s in specs if s.context is not None), default=None)
    if k is not None and context is not None and k > context:
        raise SsmportError(f"--verify {k}: the KV cache holds {context} positions (--context), fewer than one "
                           "verify call's tokens; give a smaller --verify or a larger --context")  # fmt: skip


# While building, a checkpoint's memory-mapped pages are let go of every this many elements
# stored (TensorSource.release_pages): the file is read once, never held whole.
RELEASE_PAGES_EVERY = 1 << 26


@contextlib.contextmanager
def _releasing_pages(weights, builder: WeightBuilder):
    stored, on_store = 0, builder.on_store

    def counted(n: int) -> None:
        nonlocal stored
        stored += n
        if stored >= RELEASE_PAGES_EVERY:
            weights.release_pages()
            stored = 0
        if on_store:
            on_store(n)

    builder.on_store = counted
    try:
        yield
    finally:
        builder.on_store = on_store
        weights.release_pages()


# While converting, the freed weights' heap pages go back to the OS every this many bytes:
# glibc keeps them otherwise, and the converter's own allocations do not reuse them.
TRIM_EVERY_BYTES = 128 << 20


def _releasing_converter(builder: WeightBuilder, keep: frozenset[int]):
    """A RELEASE-mode TorchConverter that frees each weight's torch storage as soon as the
    converter has copied it into the program, so a conversion holds about one copy of the
    weights instead of two (the module's and the program's). Freed: what `builder` stored,
    except the storages in `keep` (an in-memory source's own tensors, stored as they are) and
    storages that cannot be resized (memory-mapped checkpoint tensors). A weight both
    functions use is copied once; the second function reuses its constant.

    It overrides coreai-torch 0.4.3's private `_constant_from_tensor` (the version is pinned);
    where that is absent, the plain converter (twice the memory, same program)."""
    from coreai_torch import TorchConverter

    release = TorchConverter.Mode.RELEASE
    if not hasattr(TorchConverter, "_constant_from_tensor"):
        return TorchConverter(mode=release)
    from coreai._compiler.dialects import coreai

    class ReleasingConverter(TorchConverter):
        def _constant_from_tensor(self, tensor: torch.Tensor):
            storage = tensor.untyped_storage()
            if (type(tensor) not in (torch.Tensor, torch.nn.Parameter) or not builder.stored(tensor)
                    or storage_key(tensor) in keep or not storage.resizable()):  # fmt: skip
                return super()._constant_from_tensor(tensor)
            key = (storage_key(tensor), tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()),
                   tensor.dtype)  # fmt: skip
            attr = copied.get(key)
            if attr is not None:
                return coreai.ConstantOp(value=attr).result
            # The converter reads the data through .numpy(), which pins a storage's size for
            # good: hand it a copy (one tensor at a time), so the original can still be freed.
            value = super()._constant_from_tensor(tensor.clone())
            copied[key] = value.owner.attributes["value"]
            freed[0] += storage.nbytes()
            storage.resize_(0)  # the program holds the only copy now
            if freed[0] >= TRIM_EVERY_BYTES:  # glibc keeps freed heap pages until trimmed
                trim_heap()
                freed[0] = 0
            return value

    copied: dict[tuple, Any] = {}
    freed = [0]
    return ReleasingConverter(mode=release)


def _export_program(module: torch.nn.Module, example: tuple[torch.Tensor, ...], function: str, dynamic_shapes=None):
    import coreai_torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch-internal pytree deprecations
        with section(f"torch.export.export {function}"):
            ep = torch.export.export(module, example, dynamic_shapes=dynamic_shapes)
        with section(f"run_decompositions {function}"):
            return ep.run_decompositions(coreai_torch.get_decomp_table())


def check_buffers(module: torch.nn.Module, specs) -> None:
    got = [(n, tuple(b.shape), b.dtype) for n, b in module.named_buffers() if "." not in n]
    want = [(s.name, s.shape, s.dtype) for s in specs]
    if got != want:
        raise SsmportError(f"decode module states {got} differ from the declared {want}")


__all__ = ["Converted", "check_buffers", "convert"]
