"""How Apple's engines decide what each state is (StateHandlerFactory), per revision.

Three kinds: ``kv_cache`` (grows with the context; a rewind only moves a cursor),
``sliding_cache`` (fixed size, rewindable) and ``fixed`` (conv/recurrent: any rewind needs a
full reset). A state counts as fixed only if it has no dynamic dimension *and* its name
contains neither "cache" nor "kv" (case-insensitive) -- so a recurrent state named
``wkvState`` is a sliding cache. At 86b363d any model with exactly two states takes both as
a KV pair, shapes and names notwithstanding; b66a122 knows only KV pairs. The engines never
pass metadata.json's ``language.states`` to the factory, so the heuristic always decides.
"""

from __future__ import annotations

from .description import FunctionDesc, TensorDesc
from .sources import MAIN_86B363D, PRE_HYBRID, PREFILL_GRAPH, REVISIONS, STATE_FACTORY_LATER, STATE_FACTORY, cite

KV_CACHE, SLIDING_CACHE, FIXED = "kv_cache", "sliding_cache", "fixed"

LEGACY_RULE = cite(STATE_FACTORY, 53, 56)
HEURISTIC = {
    MAIN_86B363D: cite(STATE_FACTORY, 88, 101),
    PREFILL_GRAPH: cite(STATE_FACTORY, 84, 97, commit=STATE_FACTORY_LATER),
}


def infer_kind(state: TensorDesc) -> str:
    """The shape-and-name heuristic (StateHandlerFactory.inferKind)."""
    if state.is_dynamic:
        return KV_CACHE
    lower = state.name.lower()
    if "cache" in lower or "kv" in lower:
        return SLIDING_CACHE
    return FIXED


def classify(function: FunctionDesc, revision: str) -> dict[str, str]:
    """Each state's kind as the engines of ``revision`` see it, in descriptor order."""
    if revision not in REVISIONS:
        raise ValueError(f"unknown revision {revision!r}; known: {', '.join(REVISIONS)}")
    names = [s.name for s in function.states]
    if revision == PRE_HYBRID or (revision == MAIN_86B363D and len(names) == 2):
        return dict.fromkeys(names, KV_CACHE)
    return {s.name: infer_kind(s) for s in function.states}


def has_non_truncatable(kinds: dict[str, str]) -> bool:
    """Whether any rewind must be a full reset (the engines' hasNonTruncatableStates)."""
    return FIXED in kinds.values()
