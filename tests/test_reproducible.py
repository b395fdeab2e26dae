"""An export is a function of its inputs: two exports of the same preset with the same options,
in two processes, write byte-identical bundles, file for file (issue 33), and each still loads
and runs (its gate passes on the Core AI runtime).

Two processes, because what varied was per process: coreai's random graph names, LLVM's
address-seeded hash naming every weight's resource blob, the asset writer's key order and
clock, a uuid4 bundle id, the export's timings.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ssmport.errors import SsmportError
from ssmport.exporter.pipeline import export
from ssmport.reproducible import asset_metadata_json, content_id, creation_date

RECIPES = ("fp32", "int8keepproj", "int4keepproj")
# The default prefill chunk (64): its 64x64 masks are folded into resource blobs by coreai's
# C++ passes, which is where the last names came from.
_EXPORT_BOTH = """
import sys
from ssmport.exporter.pipeline import export
for recipe in {recipes!r}:
    export("rwkv7-tiny", sys.argv[1], synthetic=True, quant=recipe, gate_steps=2, progress=False)
"""


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_two_exports_in_two_processes_are_byte_identical(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", _EXPORT_BOTH.format(recipes=RECIPES), str(tmp_path / "child")],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        for recipe in RECIPES:
            result = export("rwkv7-tiny", tmp_path / "here", synthetic=True, quant=recipe, gate_steps=2, progress=False)
            assert result.manifest.gate.passed, recipe  # it loads and runs on the runtime
        out, _ = child.communicate(timeout=300)
    finally:
        child.kill()
    assert child.returncode == 0, out
    for recipe in RECIPES:
        name = f"rwkv7-tiny-{recipe}"
        here, there = _files(tmp_path / "here" / name), _files(tmp_path / "child" / name)
        assert sorted(here) == sorted(there)
        differ = [f for f in here if here[f] != there[f]]
        assert not differ, f"{recipe}: {differ} differ between two exports"
        manifest = json.loads(here["manifest.json"])
        assert "seconds" not in manifest["export"]  # timings only with --profile-memory
        assert "creationDate" not in json.loads(here["model.aimodel/metadata.json"])


def test_the_bundle_id_is_a_hash_of_the_content(multi_function_bundle):
    """The id an export records is the hash of its manifest's content at export; another
    asset (another sha256 in asset.files) has another id, so a state snapshot still names
    the bundle it belongs to."""
    from ssmport.bundle import Bundle

    data = Bundle.open(multi_function_bundle).manifest.to_json()
    recorded = data["bundle_id"]
    data |= {"bundle_id": "", "gate": None, "export": {}}
    assert content_id(data) == recorded
    data["asset"]["files"]["main.mlirb"] = "0" * 64
    assert content_id(data) != recorded


def test_source_date_epoch_sets_the_creation_date(monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    assert creation_date() is None
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert creation_date() == 1700000000.0
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(SsmportError, match="SOURCE_DATE_EPOCH"):
        creation_date()


def test_asset_metadata_is_written_in_sorted_order():
    text = asset_metadata_json({"producer": "p", "assetVersion": "2.0"})
    assert text == '{\n  "assetVersion" : "2.0",\n  "producer" : "p"\n}'


def _blobs(program) -> dict[str, tuple[str, str]]:
    """{resource name: (its type, its printed bytes: alignment then data)} of a program."""
    import re

    text = str(program._module._mlir_module)
    types = dict((n, t) for n, t in re.findall(r"dense_resource<(\w+)>\s*:\s*(tensor<[^>]*>)", text))
    return {n: (types.get(n, "?"), h) for n, h in re.findall(r'(\w+): "0x([0-9A-Fa-f]+)"', text)}


def test_a_packed_int4_weight_is_named_by_its_content_with_the_native_bytes():
    """4-bit weights reach the converter packed two to a byte (a uint8 array for an si4
    tensor); their blob was named natively (an address-seeded hash: another name in every
    process, the int4 recipes' bundles differed). Now it is named by content, its bytes and
    alignment those of the native blob."""
    import coreai_torch
    import torch
    from coreai_torch import TorchConverter

    from ssmport.ops.matmul import BlockwiseMatmul
    from ssmport.reproducible import deterministic_names

    q = torch.randint(-7, 8, (64, 48), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    module = BlockwiseMatmul(q, torch.rand(2, 48, dtype=torch.float16), bits=4).eval()

    def convert():
        ep = torch.export.export(module, (torch.randn(1, 64),)).run_decompositions(coreai_torch.get_decomp_table())
        return _blobs(TorchConverter().add_exported_program(ep, input_names=["x"], output_names=["y"]).to_coreai())

    native = convert()
    with deterministic_names():
        named = convert()
    int4 = {n: b for n, b in named.items() if b[0].endswith("xsi4>")}
    assert len(int4) == 1 and all(n.startswith("w_") for n in int4), named.keys()
    assert list(int4.values()) == [b for b in native.values() if b[0].endswith("xsi4>")]
