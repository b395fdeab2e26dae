"""``metadata.json`` and ``tokenizer/tokenizer_config.json`` as Apple's loader reads them.

`metadata_json` writes the fields and layout of Apple's exporter
(python/src/coreai_models/export/bundle.py ``_write_metadata``, read at 01dc497/af0d06f):
``metadata_version`` "0.2", ``kind`` "llm", ``name``, ``assets.main``, ``language``
{tokenizer, vocab_size, max_context_length, embedded_tokenizer, function_map}, ``source``,
``compression``, ``compilation``, ``build_info``. One addition Apple's exporter does not
write but its loader decodes (LanguageConfig.swift:28-30,68@86b363d): ``language.states``,
each state's intended kind. No engine at the revisions read passes it on, so it changes
nothing on device today; it records the intent (``ssmport check-engine`` compares the
engines' own classification against it) and is what a future engine would honour.

`tokenizer_config_json` writes what swift-transformers (class, special tokens, chat
template) and Apple's stop-token scan (LanguageConfig.additionalStopTokenIds,
LanguageConfig.swift:83-165@86b363d) read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

METADATA_VERSION = "0.2"

# RWKV World chat format (ssmport.runtime.chat): "User: ...\n\nAssistant: ...\n\nUser: ...". An
# assistant message is the reply text as generated (it starts with its own space).
WORLD_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if not loop.first %}{{ '\\n\\n' }}{% endif %}"
    "{% if message['role'] == 'system' %}{{ 'System: ' + message['content'] }}"
    "{% elif message['role'] == 'user' %}{{ 'User: ' + message['content'] }}"
    "{% elif message['role'] == 'assistant' %}{{ 'Assistant:' + message['content'] }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '\\n\\nAssistant:' }}{% endif %}"
)


def metadata_json(
    *,
    name: str,
    vocab_size: int,
    max_context_length: int,
    tokenizer: str,
    asset: str | None = None,
    function_map: Mapping[str, Sequence[str]] | None = None,
    compression: str | None = None,
    date: str | None = None,
    build_info: Mapping[str, str] | None = None,
    states: Mapping[str, str] | None = None,
) -> dict:
    """The metadata.json dict.

    ``tokenizer``: the Hugging Face id the loader falls back to when the bundle has no
    ``tokenizer/tokenizer.json`` (it also fills ``source.hf_model_id``, as Apple's exporter
    does). ``asset``: defaults to ``{name}.aimodel``. ``function_map``: defaults to Apple's
    ``{"main": ["main"]}`` (the ``prefill`` function is found by its name, not listed).
    ``compression``: None or a recipe name ("none" is written as null, as Apple does).
    ``states``: the intended kind of each state ("kv_cache", "sliding_cache", "fixed").
    """
    language: dict = {
        "tokenizer": tokenizer,
        "vocab_size": int(vocab_size),
        "max_context_length": int(max_context_length),
        "embedded_tokenizer": True,
        "function_map": {k: list(v) for k, v in (function_map or {"main": ["main"]}).items()},
    }
    if states is not None:
        language["states"] = dict(states)
    return {
        "metadata_version": METADATA_VERSION,
        "kind": "llm",
        "name": name,
        "assets": {"main": asset or f"{name}.aimodel"},
        "language": language,
        "source": {"model_definition": "torch", "hf_model_id": tokenizer},
        "compression": compression if compression not in (None, "none") else None,
        "compilation": {"date": date or datetime.now().astimezone().isoformat(), "targets": []},
        "build_info": dict(build_info or {}),
    }


def tokenizer_config_json(
    *,
    eos_token: str,
    chat_template: str,
    bos_token: str | None = None,
    unk_token: str | None = None,
    pad_token: str | None = None,
    added_tokens: Mapping[int, str] = {},
    turn_end_token: str | None = None,
    model_max_length: int | None = None,
    tokenizer_class: str = "PreTrainedTokenizerFast",
) -> dict:
    """The tokenizer_config.json dict for a bundled ``tokenizer.json``.

    ``tokenizer_class``: ``PreTrainedTokenizerFast`` loads any tokenizer.json in transformers
    and maps to swift-transformers' BPE tokenizer ("Fast" is dropped there, Tokenizer.swift:
    130@05dcbc4). ``added_tokens``: the special tokens of tokenizer.json by id (written as
    ``added_tokens_decoder``). ``turn_end_token``: a second stop token, spelled as the
    tokenizer's vocab spells it, written under the top-level key ``eot_token`` that Apple's
    stop-token scan reads (LanguageConfig.swift:152-162@86b363d); it is not made a special
    token, so text containing it still encodes as before.
    """
    config: dict = {
        "tokenizer_class": tokenizer_class,
        "eos_token": eos_token,
        "bos_token": bos_token,
        "unk_token": unk_token,
        "pad_token": pad_token,
        "clean_up_tokenization_spaces": False,
        "chat_template": chat_template,
        "added_tokens_decoder": {
            str(token_id): {
                "content": content,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for token_id, content in sorted(added_tokens.items())
        },
    }
    if model_max_length is not None:
        config["model_max_length"] = int(model_max_length)
    if turn_end_token is not None:
        config["eot_token"] = turn_end_token
    return config
