"""The architecture contract (ssmport.testing) on every built-in architecture.

Parametrized over the registry: every built-in architecture is checked on its
`tiny_preset`, with nothing to edit here. The strict-loading check also needs a small
checkpoint on disk, made by the architecture's test-side writer (written independently of
its mapping) listed below; a built-in without a writer fails with a message saying so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ssmport.architectures import architectures
from ssmport.testing import assert_architecture

BUILTINS = [a for a in architectures() if type(a).__module__.startswith("ssmport.models.")]


def _rwkv7_checkpoint(folder: Path) -> Path:
    from rwkv7_files import Dims, blinkdl_state_dict, fla_from_blinkdl, write_hf_folder

    d = Dims()
    return write_hf_folder(folder / "rwkv7-fla", *fla_from_blinkdl(blinkdl_state_dict(d, seed=21), d), shards=2)


def _rwkv6_checkpoint(folder: Path) -> Path:
    from rwkv6_files import Dims, blinkdl_state_dict, write_pth

    folder.mkdir(parents=True, exist_ok=True)
    return write_pth(folder / "rwkv6-x060.pth", blinkdl_state_dict(Dims(), seed=25))


def _mamba2_checkpoint(folder: Path) -> Path:
    from mamba2_files import Geometry, write_transformers_folder

    return write_transformers_folder(folder / "mamba2-hf", Geometry(), seed=22, tied=False, shards=2)


def _gated_deltanet_checkpoint(folder: Path) -> Path:
    from gdn_files import GDNDims, write_gdn_folder

    return write_gdn_folder(folder / "gdn-fla", GDNDims(), seed=23)


def _qwen3_5_checkpoint(folder: Path) -> Path:
    from hybrid_files import Qwen35Dims, write_qwen35_vlm

    return write_qwen35_vlm(folder / "qwen35-vlm", Qwen35Dims(), seed=24)  # the released packaging


def _olmo_hybrid_checkpoint(folder: Path) -> Path:
    from olmo_hybrid_files import write_olmo_hybrid

    return write_olmo_hybrid(folder / "olmo-hybrid", seed=25)
def _mamba1_checkpoint(folder: Path) -> Path:
    from mamba1_files import FALCON, write_transformers_folder

    return write_transformers_folder(folder / "falcon-mamba-hf", FALCON, seed=25)
def _lfm3_checkpoint(folder: Path) -> Path:
    from lfm3_files import write_lfm3

    return write_lfm3(folder / "lfm3", seed=27)


def _lfm2_moe_checkpoint(folder: Path) -> Path:
    from moe_files import write_lfm2_moe

    return write_lfm2_moe(folder / "lfm2_moe", seed=25)


def _qwen3_5_moe_checkpoint(folder: Path) -> Path:
    from moe_files import write_qwen35_moe

    return write_qwen35_moe(folder / "qwen3_5_moe", seed=26)


def _recurrent_gemma_checkpoint(folder: Path) -> Path:
    from recurrent_gemma_files import write

    return write(folder / "recurrent_gemma", seed=27)


def _hybrid_checkpoint(name: str):
    def write(folder: Path) -> Path:
        from hybrid_checks import FAMILIES

        return FAMILIES[name].write(folder / name)

    return write


CHECKPOINT_WRITERS = {
    "rwkv7": _rwkv7_checkpoint,
    "rwkv6": _rwkv6_checkpoint,
    "mamba2": _mamba2_checkpoint,
    "gated_deltanet": _gated_deltanet_checkpoint,
    "qwen3_5": _qwen3_5_checkpoint,


    "lfm2": _hybrid_checkpoint("lfm2"),
    "lfm2_moe": _lfm2_moe_checkpoint,
    "lfm3": _lfm3_checkpoint,
    "qwen3_5_moe": _qwen3_5_moe_checkpoint,
    "granitemoehybrid": _hybrid_checkpoint("granite-h"),
    "nemotron_h": _hybrid_checkpoint("nemotron-h"),
    "olmo_hybrid": _olmo_hybrid_checkpoint,
    "mamba1": _mamba1_checkpoint,
    "falcon_h1": _hybrid_checkpoint("falcon-h1"),
    "recurrent_gemma": _recurrent_gemma_checkpoint,
}


def test_every_builtin_declares_a_tiny_preset():
    assert BUILTINS, "no built-in architecture registered"
    missing = [a.name for a in BUILTINS if a.tiny_preset is None]
    assert not missing, f"built-in architectures without tiny_preset: {missing}"


@pytest.mark.parametrize("arch", BUILTINS, ids=lambda a: a.name)
def test_builtin_architecture_contract(arch, tmp_path):
    writer = CHECKPOINT_WRITERS.get(arch.name)
    checkpoint = writer(tmp_path) if writer else None
    report = assert_architecture(arch, None, tmp_path / "work", checkpoint=checkpoint)
    if writer is None:
        pytest.fail(f"{arch.name}: add a checkpoint writer to CHECKPOINT_WRITERS for the strict-loading check")
    assert report.get("strict loading").passed
