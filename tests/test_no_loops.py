"""No exported function of any built-in architecture contains a loop: Apple's GPU delegate
rejects `while_loop` (`scf.while`, apple/coreai-models#212), so every prefill recurrence runs in
a chunkwise form. Read from the printed IR, independently of ssmport.exporter.contract."""

from __future__ import annotations

import re

import pytest
import torch
from ir_checks import graph_texts

from ssmport.architectures import architectures
from ssmport.exporter.convert import convert
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.loader.resolve import load_model

BUILTINS = [a for a in architectures() if type(a).__module__.startswith("ssmport.models.")]
LOOPS = re.compile(r"coreai\.(while|for|loop)\b|scf\.(while|for)\b")


# families whose tiny preset is dense but which have MoE releases: their MoE tiny preset too
PRESETS = [a.tiny_preset for a in BUILTINS] + ["nemotron-moe-tiny", "granite-moe-tiny"]


@pytest.mark.parametrize("preset", PRESETS)
def test_no_function_contains_a_loop(preset):
    model = load_model(preset)
    arch = model.architecture
    program = convert(model, WeightBuilder(get_recipe("fp32"), arch.keeps_float), torch.float32, prefill_chunk=8).program
    texts = graph_texts(program)
    assert list(texts) == ["main", "prefill"]
    for function, text in texts.items():
        assert not LOOPS.search(text), f"{arch.name} @{function} contains {LOOPS.search(text).group(0)}"


def test_the_check_sees_a_loop():
    """The same check on a graph that does loop (the test-only kvtoy's RNN layer scans)."""
    from kvtoy import KVTOY, KVToyConfig

    from ssmport.architectures import LoadedModel

    cfg = KVToyConfig()
    model = LoadedModel(KVTOY, cfg, KVTOY.synthetic_weights(cfg, 0), {"kind": "synthetic"})
    program = convert(model, WeightBuilder(get_recipe("fp32"), KVTOY.keeps_float), torch.float32, prefill_chunk=8).program
    assert LOOPS.search(graph_texts(program)["prefill"]) and not LOOPS.search(graph_texts(program)["main"])
