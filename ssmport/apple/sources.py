"""Which Apple source each rule and each emulated behaviour was read from.

Three revisions of apple/coreai-models' Swift engines differ in what they accept:

* ``b66a122`` (2026-08-02): both engines take exactly two states, a KV pair.
* ``86b363d`` (2026-08-21, the snapshot of Apple's main read here): 2-4 states, kinds by a
  heuristic with a legacy rule that takes any two states as a KV pair; prompts go through
  ``main`` only.
* ``prefill-graph`` (September 2026, read from the stored copies of later files: Apple's
  ``StateHandlerFactory.swift``/``InputLayout.swift`` at 34ab73d and ``PrefillGraph.swift``/
  ``CoreAIPipelinedEngine.swift`` as carried by fork iannellomarco/coreai-models at 13e414e
  and 0b60a0a; apple/coreai-models PRs #204 and #227): an optional ``prefill`` function
  with no outputs, balanced prefill chunks with the last token held back for ``main``, no
  legacy rule, inputs found by name.

Line numbers of 86b363d and b66a122 are those of the fetched git history; those of the
later files were counted in their stored text.
"""

from __future__ import annotations

from dataclasses import dataclass

APPLE_REPO = "apple/coreai-models"
PRE_HYBRID = "b66a122"
MAIN_86B363D = "86b363d"
PREFILL_GRAPH = "prefill-graph"
REVISIONS = (PRE_HYBRID, MAIN_86B363D, PREFILL_GRAPH)

_SWIFT = "swift/Sources/CoreAILanguageModels/"
_SHARED = "swift/Sources/CoreAIShared/"


@dataclass(frozen=True)
class Citation:
    """A span of Apple source: ``path:first-last@commit``."""

    path: str
    first: int
    last: int
    commit: str
    repo: str = APPLE_REPO

    def __str__(self) -> str:
        where = self.path if self.repo == APPLE_REPO else f"{self.repo}/{self.path}"
        if not self.first:  # a stored copy whose lines were not counted
            return f"{where}@{self.commit}"
        lines = str(self.first) if self.first == self.last else f"{self.first}-{self.last}"
        return f"{where}:{lines}@{self.commit}"


def cite(path: str, first: int, last: int | None = None, commit: str = MAIN_86B363D, repo: str = APPLE_REPO) -> Citation:
    return Citation(path, first, first if last is None else last, commit, repo)


# -- the files, by short name -------------------------------------------------------------------
MODEL_BUNDLE = _SHARED + "Bundle/ModelBundle.swift"
MODEL_STRUCTURE = _SHARED + "Runtime/ModelStructure.swift"
LANGUAGE_BUNDLE = _SWIFT + "Bundle/LanguageBundle.swift"
LANGUAGE_CONFIG = _SWIFT + "Bundle/LanguageConfig.swift"
SEQUENTIAL = _SWIFT + "InferenceEngines/CoreAISequentialEngine.swift"
PIPELINED = _SWIFT + "InferenceEngines/CoreAIPipelinedEngine.swift"
ENGINE_FACTORY = _SWIFT + "InferenceEngines/EngineFactory.swift"
MODEL_CONFIG = _SWIFT + "InferenceEngines/ModelConfig.swift"
KV_CACHE = _SWIFT + "InferenceEngines/KVCache+CoreAI.swift"
STATE_FACTORY = _SWIFT + "Handlers/StateHandlerFactory.swift"
NDARRAY_STATE = _SWIFT + "Handlers/StateHandler+NDArray.swift"
MTL_STATE = _SWIFT + "Handlers/StateHandler+MTLBuffer.swift"
INPUT_LAYOUT = _SWIFT + "Handlers/InputLayout.swift"
PREFILL_GRAPH_FILE = _SWIFT + "InferenceEngines/PrefillGraph.swift"
RUNNER = _SWIFT + "LanguageModel/CoreAIRunner.swift"
SWIFT_TRANSFORMERS_TOKENIZER = "Sources/Tokenizers/Tokenizer.swift"

STATIC_STATE = _SWIFT + "Handlers/StateHandler+Static.swift"  # the static-shape engine's states, its sliding ring
STATIC_STATE_COMMIT = "87f9cfc"
TOKEN_INPUT = _SWIFT + "Handlers/InputHandler+Token.swift"  # compact position_ids (a later copy, fork wangqi)
FORK_PREFILL = "iannellomarco/coreai-models"  # carries Apple's PrefillGraph.swift and later engines
STATE_FACTORY_LATER = "34ab73d"
PREFILL_GRAPH_COMMIT = "13e414e"
PIPELINED_LATER = "0b60a0a"
SWIFT_TRANSFORMERS = "huggingface/swift-transformers"
SWIFT_TRANSFORMERS_COMMIT = "05dcbc4"
