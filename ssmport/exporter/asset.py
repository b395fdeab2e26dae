"""Writing the converted program as the bundle's asset: in steps that release the program before
its bytecode is hashed, with the metadata of ssmport.reproducible, and the files' sha256s the
manifest records."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ssmport.exporter.convert import Converted
from ssmport.memory import return_freed_memory, section
from ssmport.reproducible import asset_metadata_json, creation_date


def save_asset(converted: Converted, path: Path) -> None:
    """`program.save_asset(path)` in its own steps, so that the program (the one copy of the
    weights left in memory) is released once its bytecode is on disk, before the bytecode is
    hashed: coreai-core's save_asset hashes `read_bytes()` of the whole file while the program
    is still alive, two copies of the weights at once. The steps and private names are
    coreai-core 1.0.0b3's (pinned); where they are absent, save_asset itself. Either way
    `converted.program` is None afterwards."""
    program = converted.program
    try:
        from coreai.authoring.asset import _COREAI_PRODUCER, OSVersion
        from coreai.runtime import _AIModelAsset

        steps = hasattr(_AIModelAsset, "_create") and hasattr(program, "_save_bytecode")
    except ImportError:
        steps = False
    if not steps:
        with section("save_asset"):
            program.save_asset(path)
        converted.program = program = None
        return_freed_memory(converted.parameters)
        _settle_metadata(path)
        return

    def stamp(meta) -> None:
        meta.creation_date = creation_date()  # None unless SOURCE_DATE_EPOCH: ssmport.reproducible
        meta._producer = _COREAI_PRODUCER

    path.mkdir(parents=True)
    asset = _AIModelAsset._create(path=str(path), metadata=None)
    with section("serialize bytecode"):
        program._save_bytecode(asset._program_bytecode_path, minimum_os=OSVersion.v27)
    with section("release program"):
        converted.program = program = None
        return_freed_memory(converted.parameters)
    asset.update_metadata(updates=stamp)
    with section("hash bytecode"), open(asset._program_bytecode_path, "rb") as f:
        asset._program_hash_path.write_bytes(hashlib.file_digest(f, "sha256").digest())
    _settle_metadata(path)


def _settle_metadata(asset: Path) -> None:
    """The asset's metadata.json, written again with sorted keys (the asset writer's order
    changes from process to process) and the creation date of ssmport.reproducible."""
    meta = asset / "metadata.json"
    data = json.loads(meta.read_text())
    date = creation_date()
    if date is None:
        data.pop("creationDate", None)  # save_asset (the fallback above) stamps the clock
    meta.write_text(asset_metadata_json(data))


def asset_file_hashes(asset: Path) -> dict[str, str]:
    """The sha256 of every file of the asset, as the manifest records them (ssmport.runtime.lowering
    checks them before lowering)."""
    from ssmport.runtime.lowering import asset_file_hashes as hashes  # the runtime package loads coreai

    return hashes(asset)


__all__ = ["asset_file_hashes", "save_asset"]
