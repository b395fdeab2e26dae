"""Decode graphs work on each state in its stored shape. The deferred update
(ssmport.ops.deferred) runs on the recurrent state as it is stacked: no reshape of the whole
state before or after it, each a copy of the whole state on the Linux runtime; and none to read
a layer's slice (ssmport.ops.rows.read_layer), except the row view of a state its blocks read
flat (`flat_reads`: RWKV-7's recState). Mamba-1's and
Mamba-2's conv states are time-major, as their conv reads them: no transpose in and out of each
layer. Read from the printed IR of the decode graph."""

from __future__ import annotations

import math
import re

import pytest
import torch
from ir_checks import graph_texts

from ssmport.exporter.convert import convert
from ssmport.loader.resolve import load_model
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder

# every form of the update: RWKV-7 (two terms), RWKV-6, Gated DeltaNet (Qwen3.5), Mamba-1 (an
# `Exp` decay), Mamba-2 with one group and with B shared by groups of heads (nemotron-h-tiny)
PRESETS = ["rwkv7-tiny", "rwkv6-tiny", "qwen3.5-tiny", "mamba1-tiny", "mamba2-tiny", "nemotron-h-tiny"]
HANDLE = re.compile(r"coreai\.read_handle [^\n]*-> \((tensor<[\dx]+xf32>),")
RESHAPE = re.compile(r"= coreai\.reshape [^\n]*: \((tensor<[\dx?]+xf32>), [^\n]*-> (tensor<[\dx?]+xf32>)")


def elements(tensor_type: str) -> int:
    return math.prod(int(d) for d in tensor_type[len("tensor<") : -len("xf32>")].split("x"))


def decode_graph(preset: str) -> str:
    model = load_model(preset)
    builder = WeightBuilder(get_recipe("fp32"), model.architecture.keeps_float)
    return graph_texts(convert(model, builder, torch.float32, prefill_chunk=None).program)["main"]


def read_flat(preset: str, size: int) -> bool:
    """Whether the decode module's blocks read the state of `size` elements flat (`flat_reads`)."""
    model = load_model(preset)
    arch = model.architecture
    module = arch.build_decode(model.config, model.weights, WeightBuilder(get_recipe("fp32"), arch.keeps_float), torch.float32)
    (spec,) = [s for s in module.specs if math.prod(s.shape) == size]
    return any(spec.name in getattr(layer, "flat_reads", ()) for layer in module.layers)


@pytest.mark.parametrize("preset", PRESETS)
def test_the_recurrent_state_is_reshaped_only_where_read_flat(preset):
    text = decode_graph(preset)
    state = max(HANDLE.findall(text), key=elements)  # the recurrent state: the largest fixed-size one
    of_state_size = [(a, b) for a, b in RESHAPE.findall(text) if "?" not in a + b and elements(a) == elements(state)]
    if read_flat(preset, elements(state)):  # the row view [L, rest], once per call (ssmport.ops.rows.read_layer)
        assert of_state_size == [(state, of_state_size[0][1])], of_state_size
    else:
        assert of_state_size == [], f"{preset}: {of_state_size}"


@pytest.mark.parametrize("preset", ["mamba1-tiny", "mamba2-tiny"])
def test_the_conv_state_is_read_and_written_without_a_transpose(preset):
    assert "coreai.transpose" not in decode_graph(preset)


@pytest.mark.parametrize("preset", ["lfm2-tiny", "qwen3.5-tiny"])
def test_a_growing_kv_cache_is_read_without_reshaping_it_whole(preset):
    """A layer's rows of a growing cache are a gather on the cache as it is
    (ssmport.growing_kv.read_kv_layer): the row view [L, rest] copied the whole cache a call."""
    text = decode_graph(preset)
    caches = set(re.findall(r"coreai\.read_handle [^\n]*-> \((tensor<[\dx]+x\?x[\dx]+xf32>),", text))
    whole = [a for a, _ in re.findall(r"= coreai\.reshape [^\n]*: \((tensor<[^>]+>), [^\n]*-> (tensor<[^>]+>)", text) if a in caches]
    assert caches, f"{preset}: no growing cache in the decode graph"
    assert whole == [], f"{preset}: {whole}"
