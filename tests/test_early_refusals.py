"""Bad input found before the heavy work, not after it (issue 33): the conversion takes
minutes on a real model, and an error found at its end named the staging copy of the file."""

from __future__ import annotations

import shutil

import pytest

import ssmport.exporter.pipeline
from hybrid_files import write_tokenizer
from test_errors import assert_no_bundle, assert_one_line, run_cli


@pytest.mark.parametrize("config, said", [("{not json", "not a readable tokenizer_config.json"),
                                          ("[1, 2]", "tokenizer_config.json is not a JSON object")])  # fmt: skip
def test_a_bad_tokenizer_config_is_refused_before_the_conversion(fla_folder, tmp_path, capsys, monkeypatch, config,
                                                                 said):  # fmt: skip
    folder = shutil.copytree(fla_folder, tmp_path / "user-model")
    write_tokenizer(folder, 256, "lfm2")
    (folder / "tokenizer_config.json").write_text(config)

    def no_conversion(*args, **kwargs):
        raise AssertionError("the conversion started")

    monkeypatch.setattr(ssmport.exporter.pipeline, "convert", no_conversion)
    code, out, err = run_cli(capsys, "export", folder, "-o", tmp_path / "out", "--quant", "fp32", "--no-gate", "-q")
    assert_one_line(code, out, err, f"{folder / 'tokenizer_config.json'}: {said}")
    assert_no_bundle(tmp_path / "out")
