"""A bundle whose asset carries a second function (what a prefill function will look like)."""

from __future__ import annotations

import shutil
from pathlib import Path

from ssmport.architectures.base import INPUT_NAMES, OUTPUT_NAMES
from ssmport.bundle import ASSET, Bundle
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.sources import rebuild_source
from ssmport.state import STATE_DTYPES


def rebuild_with_second_function(path: Path, name: str = "prefill") -> Path:
    """Replace the bundle's asset by one with `main` and `name`, both the decode graph."""
    import coreai_torch
    import torch
    from coreai_torch import TorchConverter

    m = Bundle.open(path).manifest
    model = rebuild_source(m["source"])
    state_dtype = STATE_DTYPES[m["recipe"]["state_dtype"]]
    specs = model.architecture.state_specs(model.config, state_dtype)

    def exported():
        builder = WeightBuilder(get_recipe(m["recipe"]["name"]), model.architecture.keeps_float)
        module = model.architecture.build_decode(model.config, model.weights, builder, state_dtype).eval()
        example = (torch.zeros(1, 1, dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32))
        return torch.export.export(module, example).run_decompositions(coreai_torch.get_decomp_table())

    names = {"input_names": list(INPUT_NAMES), "output_names": list(OUTPUT_NAMES), "state_names": [s.name for s in specs]}
    program = (
        TorchConverter(mode=TorchConverter.Mode.RELEASE)
        .add_exported_program(exported(), **names)
        .add_exported_program(exported(), entrypoint_name=name, **names)
        .to_coreai()
    )
    shutil.rmtree(path / ASSET)
    program.save_asset(path / ASSET)
    return path
