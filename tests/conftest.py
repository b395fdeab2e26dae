"""Shared fixtures: tiny checkpoints on disk and bundles exported once per session."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from rwkv7_files import Dims, blinkdl_state_dict, fla_from_blinkdl, write_hf_folder, write_pth
from terminal_signals import TERMINAL_SIGNALS


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Lowered models go to a per-session cache, never the user's."""
    os.environ["SSMPORT_CACHE"] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session", autouse=True)
def _no_real_hub(tmp_path_factory):
    """No test reaches the real Hugging Face Hub (a released preset downloads by default):
    offline mode over an empty per-session cache. tests/test_hub.py serves its own Hub."""
    from fake_hub import set_hub_env

    home = tmp_path_factory.mktemp("hf-home")
    set_hub_env({"HF_HOME": str(home), "HF_HUB_CACHE": None, "HUGGINGFACE_HUB_CACHE": None, "HF_ENDPOINT": None,
                 "HF_HUB_OFFLINE": "1", "HF_TOKEN": None, "HF_HUB_DISABLE_TELEMETRY": "1"})  # fmt: skip


@pytest.fixture
def terminal_signals():
    """For the tests that signal themselves (see terminal_signals.py)."""
    previous = {sig: signal.signal(sig, handler) for sig, handler in TERMINAL_SIGNALS.items()}
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)


@pytest.fixture(scope="session")
def dims() -> Dims:
    return Dims()


@pytest.fixture(scope="session")
def files(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("files")


@pytest.fixture(scope="session")
def blinkdl_pth(files, dims) -> Path:
    """fp32 BlinkDL .pth that carries layer 0's (unused) v0/v1/v2."""
    return write_pth(files / "rwkv7-tiny-fp32.pth", blinkdl_state_dict(dims, seed=11, layer0_v=True))


@pytest.fixture(scope="session")
def blinkdl_bf16_pth(files, dims) -> Path:
    """bf16 BlinkDL .pth without layer 0's v0/v1/v2."""
    sd = blinkdl_state_dict(dims, seed=12, layer0_v=False, dtype=torch.bfloat16)
    return write_pth(files / "rwkv7-tiny-bf16.pth", sd)


@pytest.fixture(scope="session")
def fla_folder(files, dims, blinkdl_pth) -> Path:
    """The fp32 .pth's weights in fla's HF layout, as a 3-shard safetensors folder."""
    config, tensors = fla_from_blinkdl(torch.load(blinkdl_pth, weights_only=True), dims)
    return write_hf_folder(files / "rwkv7-tiny-fla", config, tensors, shards=3)


@pytest.fixture(scope="session")
def bundles(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bundles")


def _export(spec, out, **kw):
    from ssmport.exporter.pipeline import export

    return export(str(spec), out, progress=False, **kw)


@pytest.fixture(scope="session")
def pth_fp32_bundle(blinkdl_pth, bundles):
    return _export(blinkdl_pth, bundles, quant="fp32", gate_steps=6)


@pytest.fixture(scope="session")
def pth_fp16_bundle(blinkdl_pth, bundles):
    return _export(blinkdl_pth, bundles, quant="fp16", gate_steps=6)


@pytest.fixture(scope="session")
def export_fn():
    return _export


@pytest.fixture
def scratch_bundle(pth_fp32_bundle, tmp_path):
    """A private copy of the fp32 bundle, for tests that rewrite its gate record."""
    import shutil

    return shutil.copytree(pth_fp32_bundle.path, tmp_path / pth_fp32_bundle.path.name)


@pytest.fixture(scope="session")
def multi_function_bundle(bundles):
    """rwkv7-tiny (synthetic, fp32, World tokenizer) with its two functions, `main` and
    `prefill`: the shape of asset that made the Swift runtime abort at interpreter exit."""
    from ssmport.exporter.pipeline import export

    result = export("rwkv7-tiny", bundles, synthetic=True, quant="fp32", gate=False, progress=False,
                    name="rwkv7-tiny-two-functions", prefill_chunk=8)  # fmt: skip
    assert result.manifest.prefill.function == "prefill"
    return result.path


@pytest.fixture(scope="session")
def world_bundle(tmp_path_factory) -> dict[str, Path]:
    """A tiny RWKV-7 bundle with a small World tokenizer, a prefill function and a gate record
    (tests of what commands do with a bundle's files); `pth` is its source."""
    from ssmport.exporter.pipeline import export
    from test_bad_inputs import small_world_vocab

    root = tmp_path_factory.mktemp("world-bundle")
    (root / "rwkv").mkdir()
    pth = write_pth(root / "rwkv" / "r.pth", blinkdl_state_dict(Dims(), seed=5))
    (root / "rwkv" / "rwkv_vocab_v20230424.txt").write_text(small_world_vocab())
    bundle = export(str(pth), root / "bundles", quant="fp32", gate_steps=2, progress=False, prefill_chunk=8).path
    return {"pth": pth, "bundle": bundle}
