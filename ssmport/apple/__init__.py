"""Bundles for Apple's own engines (apple/coreai-models' CoreAILanguageModels), read from their source.

* `metadata`: metadata.json and tokenizer_config.json as Apple's exporter writes them;
* `description`: a neutral description of a bundle (metadata, files, functions);
* `engine_rules`: which engine (sequential, pipelined, static-shape) can drive a bundle at each
  source revision, and the exact guard each other one fails;
* `state_kinds`: the engines' state classification;
* `graph`, `export`, `layout`: the apple layout (ssmport.layout): the functions and states the
  engines drive, their tracing shapes, the files beside the asset.

The engines' driving protocol, emulated over any model object, is test code:
tests/apple_protocol.py.

docs/apple-engines.md says what the engines require and from which commits.
"""

from .description import DYNAMIC, BundleDesc, FunctionDesc, TensorDesc, describe_directory
from .engine_rules import ENGINES, Guard, Verdict, check_engine, check_engines
from .metadata import WORLD_CHAT_TEMPLATE, metadata_json, tokenizer_config_json
from .sources import REVISIONS

__all__ = [
    "DYNAMIC",
    "ENGINES",
    "REVISIONS",
    "WORLD_CHAT_TEMPLATE",
    "BundleDesc",
    "FunctionDesc",
    "Guard",
    "TensorDesc",
    "Verdict",
    "check_engine",
    "check_engines",
    "describe_directory",
    "metadata_json",
    "tokenizer_config_json",
]
