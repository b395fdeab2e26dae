"""Bad input found before the heavy work, not after it (issue 33): the conversion takes
minutes on a real model, and an error found at its end named the staging copy of the file."""

from __future__ import annotations

import shutil

import pytest

import ssmport.exporter.pipeline
from hybrid_files import write_tokenizer
from test_errors import assert_no_bundle, assert_one_line, run_cli


@pytest.mark.parametrize("config, said", [("{not json", "not a readable tokenizer_config.json"),
                                          ("[1, 2]", "tokenizer_config.json is not a JSON object"),
                                          ('{"chat_template": "{% include \'x.jinja\' %}"}',
                                           "the chat template does not render (TypeError")])  # fmt: skip
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


# A ChatML template as released ones write it: a default system turn, tojson, strftime_now, and a
# refusal of roles it does not know (the placeholder conversation has none of those).
_RELEASED_LIKE = (
    "{%- if messages[0].role != 'system' %}{{- '<|im_start|>system\\nYou are helpful. ' + strftime_now('%Y') + "
    "'<|im_end|>\\n' }}{%- endif %}{%- for m in messages %}{%- if m.role not in ['system', 'user', 'assistant'] %}"
    "{{- raise_exception('unknown role ' + m.role) }}{%- endif %}{{- '<|im_start|>' + m.role + '\\n' + m.content + "
    "'<|im_end|>\\n' }}{%- endfor %}{%- if tools %}{{ tools | tojson }}{%- endif %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.mark.parametrize("template", [_RELEASED_LIKE, "{{ messages }}", "{{ raise_exception('Conversation roles must alternate') }}"])
def test_a_template_that_renders_or_refuses_the_placeholders_itself_is_exported(tmp_path, template):
    """Export renders the template before the conversion (a template that cannot render was
    exported and refused only by `chat`); a template whose own raise_exception refuses the
    placeholder conversation passes: a real one may insist on what the placeholders lack."""
    import json

    from ssmport.tokenizers.chat_template import check_renders

    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "eos_token": "<|im_end|>"}))
    check_renders(tmp_path)
