"""metadata.json and tokenizer_config.json as Apple's exporter writes them and its loader reads them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from apple_toys import RECURRENT_3, toy_bundle

from ssmport.apple.description import describe_directory
from ssmport.apple.engine_rules import SEQUENTIAL_ENGINE, check_engine
from ssmport.apple.metadata import WORLD_CHAT_TEMPLATE, metadata_json, tokenizer_config_json
from ssmport.apple.sources import MAIN_86B363D
from ssmport.runtime.chat import RWKV_WORLD_CHAT
from ssmport.tokenizers import BUNDLED_WORLD_VOCAB, WorldTokenizer
from ssmport.tokenizers.world_json import END_OF_TEXT, world_tokenizer_json


def test_metadata_has_apples_fields_and_layout() -> None:
    meta = metadata_json(name="rwkv7-0.1b", vocab_size=65536, max_context_length=4096, tokenizer="BlinkDL/rwkv-7-world",
                         compression="none", date="2026-11-01T00:00:00+00:00", build_info={"ssmport": "0.1.0"})
    # The keys and nesting of coreai_models/export/bundle.py _write_metadata (af0d06f).
    assert meta == {
        "metadata_version": "0.2",
        "kind": "llm",
        "name": "rwkv7-0.1b",
        "assets": {"main": "rwkv7-0.1b.aimodel"},
        "language": {
            "tokenizer": "BlinkDL/rwkv-7-world",
            "vocab_size": 65536,
            "max_context_length": 4096,
            "embedded_tokenizer": True,
            "function_map": {"main": ["main"]},
        },
        "source": {"model_definition": "torch", "hf_model_id": "BlinkDL/rwkv-7-world"},
        "compression": None,
        "compilation": {"date": "2026-11-01T00:00:00+00:00", "targets": []},
        "build_info": {"ssmport": "0.1.0"},
    }
    with_states = metadata_json(name="m", vocab_size=8, max_context_length=16, tokenizer="t", compression="int8keepproj",
                                asset="model.aimodel", states={"recState": "fixed"})
    assert with_states["language"]["states"] == {"recState": "fixed"}
    assert with_states["compression"] == "int8keepproj" and with_states["assets"]["main"] == "model.aimodel"
    assert with_states["compilation"]["date"]  # now, ISO 8601


@pytest.fixture(scope="module")
def world_bundle(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bundle")
    world = WorldTokenizer.from_file(BUNDLED_WORLD_VOCAB)
    (root / "tokenizer").mkdir()
    (root / "tokenizer" / "tokenizer.json").write_text(world_tokenizer_json(world), encoding="utf-8")
    config = tokenizer_config_json(eos_token=END_OF_TEXT, bos_token=END_OF_TEXT, chat_template=WORLD_CHAT_TEMPLATE,
                                   added_tokens={0: END_OF_TEXT}, model_max_length=4096)
    (root / "tokenizer" / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    meta = metadata_json(name="toy", vocab_size=61, max_context_length=512, tokenizer="ssmport/toy",
                         states={"recState": "fixed", "attnShiftState": "fixed", "ffnShiftState": "fixed"})
    (root / "metadata.json").write_text(json.dumps(meta), encoding="utf-8")
    (root / "toy.aimodel").mkdir()
    return root


def test_a_written_bundle_passes_the_loader_rules(world_bundle: Path) -> None:
    desc = describe_directory(world_bundle, toy_bundle(RECURRENT_3).functions)
    assert {"tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json", "toy.aimodel"} <= desc.files
    assert desc.tokenizer_has_merges and desc.tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    verdict = check_engine(desc, SEQUENTIAL_ENGINE, MAIN_86B363D)
    assert verdict.can_drive, [str(g) for g in verdict.failures]


def test_transformers_loads_the_tokenizer_and_renders_ssmports_chat(world_bundle: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(world_bundle / "tokenizer"))
    assert tok.eos_token_id == 0
    world = WorldTokenizer.from_file(BUNDLED_WORLD_VOCAB)
    text = "Hello\n\nUser: 你好 😀 ĊĊ\tend"
    assert tok.encode(text, add_special_tokens=False) == world.encode(text)
    assert tok.decode(world.encode(text)) == text
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " Hello!"},
                {"role": "user", "content": "again"}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    chat = RWKV_WORLD_CHAT
    assert rendered == chat.user_turn("hi", True) + " Hello!" + chat.user_turn("again", False)


def test_a_turn_end_token_is_written_where_apple_reads_it() -> None:
    config = tokenizer_config_json(eos_token=END_OF_TEXT, chat_template=WORLD_CHAT_TEMPLATE, turn_end_token="ĊĊ")
    assert config["eot_token"] == "ĊĊ"  # LanguageConfig.additionalStopTokenIds reads top-level "eot_token"
    assert "eot_token" not in tokenizer_config_json(eos_token=END_OF_TEXT, chat_template=WORLD_CHAT_TEMPLATE)
