"""Qwen3.5's multi-token-prediction head (`mtp.*`) as the bundle's draft function
(ssmport.models.qwen3_5.mtp) and `--draft mtp`.

The checkpoint: a tiny non-square Qwen3.5 written by transformers' save_pretrained (seeded),
its config.json saying mtp_num_hidden_layers = 1, with the 15 `mtp.*` tensors added to its
safetensors file.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

import hybrid_files as hf
from ssmport.errors import CheckpointError

DIMS = hf.Qwen35Dims(tied=False)


def write_mtp_checkpoint(folder: Path, drop: str | None = None, seed: int = 1) -> Path:
    """write_qwen35_text's folder plus the MTP head's tensors (all but `drop`)."""
    hf.write_qwen35_text(folder, DIMS, seed=seed)
    path = folder / "model.safetensors"
    tensors = load_file(str(path)) | hf.qwen35_mtp_tensors(DIMS, seed)
    if drop is not None:
        del tensors[drop]
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})
    return folder


def test_strict_loading_names_a_missing_mtp_tensor(tmp_path):
    from ssmport.loader.resolve import load_model

    missing = "mtp.layers.0.self_attn.k_norm.weight"
    folder = write_mtp_checkpoint(tmp_path / "broken", drop=missing)
    with pytest.raises(CheckpointError, match=r"missing 1: .*mtp\.layers\.0\.self_attn\.k_norm\.weight") as err:
        load_model(str(folder))
    assert "\n" not in str(err.value)


def test_the_head_loads_only_where_declared_and_present(tmp_path):
    from ssmport.loader.resolve import load_model

    with_head = load_model(str(write_mtp_checkpoint(tmp_path / "mtp")))
    assert with_head.config.mtp_layers == 1 and sum(n.startswith("mtp.") for n in with_head.weights) == 15
    plain = load_model(str(hf.write_qwen35_text(tmp_path / "plain", DIMS, seed=1)))  # declared, no tensors
    assert plain.config.mtp_layers == 0 and "mtp_layers" not in plain.config.to_json()
    assert not any(n.startswith("mtp.") for n in plain.weights)
