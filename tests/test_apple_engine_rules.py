"""check-engine's rules: one bundle description built to break each, and the layouts that pass.

Each case starts from a description that the named engine and revision accept, changes one
thing, and expects exactly the rule written for it among the failures.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
from apple_toys import ATTENTION, HYBRID, IDS, LOGITS, POS, RECURRENT_2, RECURRENT_3, VOCAB, toy_bundle

from ssmport.apple.description import BundleDesc, FunctionDesc, TensorDesc
from ssmport.apple.engine_rules import (
    PIPELINED_ENGINE,
    SEQUENTIAL_ENGINE,
    STATIC_SHAPE_ENGINE,
    THROWS,
    check_engine,
    check_engines,
)
from ssmport.apple.sources import MAIN_86B363D, PRE_HYBRID, PREFILL_GRAPH

SEQ, PIPE = SEQUENTIAL_ENGINE, PIPELINED_ENGINE
NOW, LATER = MAIN_86B363D, PREFILL_GRAPH


def rules(desc: BundleDesc, engine: str, revision: str) -> set[str]:
    return {g.rule for g in check_engine(desc, engine, revision).failures}


def with_meta(desc: BundleDesc, edit) -> BundleDesc:
    meta = copy.deepcopy(dict(desc.metadata))
    edit(meta)
    return replace(desc, metadata=meta)


def with_main(desc: BundleDesc, **changes) -> BundleDesc:
    functions = dict(desc.functions)
    functions["main"] = replace(functions["main"], **changes)
    return replace(desc, functions=functions)


def with_prefill(desc: BundleDesc, **changes) -> BundleDesc:
    functions = dict(desc.functions)
    functions["prefill"] = replace(functions["prefill"], **changes)
    return replace(desc, functions=functions)


REC, HYB = toy_bundle(RECURRENT_3), toy_bundle(HYBRID)
KV = (TensorDesc("keyCache", (1, 1, 1, None, 6), "float32"), TensorDesc("valueCache", (1, 1, 1, None, 6), "float32"))


def with_states(desc: BundleDesc, states: tuple[TensorDesc, ...], kinds: dict[str, str]) -> BundleDesc:
    """The bundle with these states in main and prefill, language.states declaring `kinds`."""
    desc = with_prefill(with_main(desc, states=states), states=states)
    return with_meta(desc, lambda meta: meta["language"].__setitem__("states", kinds))


RING = TensorDesc("slidingCache", (4, 1, 1, 6, 6), "float32")  # ssmport's two rings as one state


def _set(path: str, value):
    def edit(meta):
        *parents, last = path.split(".")
        node = meta
        for p in parents:
            node = node[p]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value
    return edit


_DELETE = object()

CASES = [
    # -- the loader (every engine, every revision) --
    ("no metadata.json", lambda d: replace(d, metadata=None), SEQ, NOW, "bundle.metadata"),
    ("metadata_version 0.1", lambda d: with_meta(d, _set("metadata_version", "0.1")), SEQ, NOW, "bundle.version"),
    ("no metadata_version", lambda d: with_meta(d, _set("metadata_version", _DELETE)), SEQ, NOW, "bundle.version"),
    ("unknown kind", lambda d: with_meta(d, _set("kind", "chatbot")), SEQ, NOW, "bundle.common"),
    ("kind not a language model", lambda d: with_meta(d, _set("kind", "diffusion")), SEQ, LATER, "bundle.kind"),
    ("no assets.main", lambda d: with_meta(d, _set("assets", {})), PIPE, NOW, "bundle.assets.main"),
    ("asset missing", lambda d: replace(d, files=d.files - {"toy.aimodel"}), SEQ, NOW, "bundle.asset.exists"),
    ("no language block", lambda d: with_meta(d, _set("language", _DELETE)), SEQ, NOW, "bundle.language"),
    ("vocab_size a string", lambda d: with_meta(d, _set("language.vocab_size", "61")), SEQ, NOW, "bundle.language.fields"),
    ("max_context_length missing", lambda d: with_meta(d, _set("language.max_context_length", _DELETE)), SEQ, NOW,
     "bundle.language.fields"),
    ("embedded_tokenizer not a bool", lambda d: with_meta(d, _set("language.embedded_tokenizer", "yes")), SEQ, NOW,
     "bundle.language.fields"),
    ("function_map names not a list", lambda d: with_meta(d, _set("language.function_map", {"main": "main"})), SEQ, NOW,
     "bundle.language.fields"),
    ("states kind unknown", lambda d: with_meta(d, _set("language.states", {"recState": "recurrent"})), SEQ, NOW,
     "bundle.language.fields"),
    ("no tokenizer.json", lambda d: replace(d, files=d.files - {"tokenizer/tokenizer.json"}), SEQ, NOW, "tokenizer.embedded"),
    ("embedded_tokenizer false", lambda d: with_meta(d, _set("language.embedded_tokenizer", False)), SEQ, NOW,
     "tokenizer.embedded"),
    ("tokenizer class unknown to swift-transformers",
     lambda d: replace(d, tokenizer_config={**d.tokenizer_config, "tokenizer_class": "RwkvTokenizer"}), SEQ, NOW, "tokenizer.class"),
    ("no tokenizer_config.json", lambda d: replace(d, tokenizer_config=None), SEQ, NOW, "tokenizer.class"),
    ("BPE class without merges", lambda d: replace(d, tokenizer_has_merges=False), SEQ, NOW, "tokenizer.merges"),
    # -- engine selection --
    ("chunked static functions",
     lambda d: replace(d, functions={**d.functions, "extend_512_1": d.functions["main"], "load_embeddings": FunctionDesc()}),
     SEQ, NOW, "factory.structure"),
    ("function_map names a missing function", lambda d: with_meta(d, _set("language.function_map", {"main": ["decode"]})),
     PIPE, LATER, "engine.function"),
    # -- the sequential engine --
    ("three inputs", lambda d: with_main(d, inputs=(IDS, POS, TensorDesc("valid_len", (1,), "int32"))), SEQ, NOW,
     "sequential.inputs"),
    ("attn_mask is a third input only later",
     lambda d: with_main(d, inputs=(IDS, POS, TensorDesc("attn_mask", (1, 1, None, None), "float16"))), SEQ, NOW,
     "sequential.inputs"),
    ("no outputs", lambda d: with_main(d, outputs=()), SEQ, NOW, "sequential.outputs"),
    ("one state", lambda d: with_main(d, states=d.functions["main"].states[:1]), SEQ, NOW, "sequential.states"),
    ("five states",
     lambda d: with_main(d, states=d.functions["main"].states + KV), SEQ, LATER, "sequential.states"),
    ("three states before the hybrid engines", lambda d: REC, SEQ, PRE_HYBRID, "sequential.states"),
    ("inputs not named as InputLayout knows them",
     lambda d: with_main(d, inputs=(replace(IDS, name="tokens"), POS)), SEQ, LATER, "inputs.names"),
    ("int64 token ids", lambda d: with_main(d, inputs=(replace(IDS, dtype="int64"), POS)), SEQ, NOW, "inputs.dtype"),
    ("static position_ids", lambda d: with_main(d, inputs=(IDS, replace(POS, shape=(1, 1)))), SEQ, NOW,
     "inputs.position_shape"),
    ("static 64-token input_ids", lambda d: with_main(d, inputs=(replace(IDS, shape=(1, 64)), POS)), SEQ, LATER,
     "inputs.ids_shape"),
    ("one-token main before the prefill graph", lambda d: with_main(d, inputs=(replace(IDS, shape=(1, 1)), POS)), SEQ, NOW,
     "inputs.ids_shape"),
    ("float32 logits", lambda d: with_main(d, outputs=(replace(LOGITS, dtype="float32"),)), SEQ, NOW, "logits.dtype"),
    ("logits wider than vocab_size", lambda d: with_main(d, outputs=(replace(LOGITS, shape=(1, None, VOCAB + 3)),)), SEQ, NOW,
     "logits.shape"),
    ("last-token logits only, prompts through main", lambda d: with_main(d, outputs=(replace(LOGITS, shape=(1, 1, VOCAB)),)),
     SEQ, NOW, "logits.shape"),
    ("int32 state", lambda d: with_main(d, states=(replace(d.functions["main"].states[0], dtype="int32"),)
                                          + d.functions["main"].states[1:]), SEQ, NOW, "states.dtype"),
    # -- the pipelined engine --
    ("pure recurrent: no KV pair", lambda d: toy_bundle(RECURRENT_3), PIPE, NOW, "pipelined.kv_pair"),
    ("attn_mask input", lambda d: with_main(d, inputs=(IDS, POS, TensorDesc("attn_mask", (1, 1, None, None), "float16"))),
     PIPE, LATER, "pipelined.inputs"),
    ("no outputs", lambda d: with_main(d, outputs=()), PIPE, NOW, "pipelined.outputs"),
    ("five states", lambda d: with_main(d, states=d.functions["main"].states + KV[:1]), PIPE, NOW, "pipelined.states"),
    ("static [1, 1, V] logits (issue #212)",
     lambda d: with_main(d, inputs=(IDS, POS), outputs=(replace(LOGITS, shape=(1, 1, VOCAB)),)), PIPE, NOW, "logits.shape"),
    # -- state kinds and layouts --
    ("two fixed states: the legacy KV pair rule", lambda d: toy_bundle(RECURRENT_2), SEQ, NOW, "states.kind"),
    ("two fixed states before the hybrid engines", lambda d: toy_bundle(RECURRENT_2), SEQ, PRE_HYBRID, "states.kind"),
    ("two fixed states, intent not declared", lambda d: toy_bundle(RECURRENT_2, states_metadata=False), SEQ, NOW,
     "states.kv_static"),
    ("a recurrent state named like a KV cache",
     lambda d: with_meta(with_main(d, states=(replace(d.functions["main"].states[0], name="wkvState"),)
                                   + d.functions["main"].states[1:]),
                         _set("language.states", {"wkvState": "fixed", "attnShiftState": "fixed", "ffnShiftState": "fixed"})),
     SEQ, LATER, "states.kind"),
    ("KV states growing along different dims",
     lambda d: with_main(d, states=(KV[0], replace(KV[1], shape=(1, 1, None, 1, 6))) + d.functions["main"].states[2:]),
     SEQ, NOW, "states.kv_layout"),
    ("pipelined KV pair with the sequence at dim 2 of 5",
     lambda d: with_main(d, states=tuple(replace(k, shape=(1, 1, None, 1, 6)) for k in KV) + d.functions["main"].states[2:]),
     PIPE, NOW, "states.kv_layout"),
    # -- sliding-window rings --
    ("a ring with no fixed state (rewinds move the cursor)",
     lambda d: with_states(d, KV + (RING,), {"keyCache": "kv_cache", "valueCache": "kv_cache", "slidingCache": "sliding_cache"}),
     PIPE, LATER, "states.ring_rewind"),
    ("every state a sliding cache (compact positions)",
     lambda d: with_states(d, (RING, replace(RING, name="slidingValueCache")), {}), SEQ, LATER, "states.all_sliding"),
    # -- the prefill function (prefill-graph revision) --
    ("prefill inputs in another order", lambda d: with_prefill(d, inputs=(POS, IDS)), SEQ, LATER, "prefill.inputs"),
    ("prefill without a state", lambda d: with_prefill(d, states=d.functions["prefill"].states[1:]), PIPE, LATER,
     "prefill.states"),
    ("prefill with logits and valid_len (ssmport's own prefill)",
     lambda d: with_prefill(d, outputs=(LOGITS,)), SEQ, LATER, "prefill.outputs"),
    ("prefill at a fixed 64-token chunk", lambda d: with_prefill(d, inputs=(replace(IDS, shape=(1, 64)), POS)), SEQ, LATER,
     "prefill.ids_shape"),
]


@pytest.mark.parametrize("name, breaker, engine, revision, rule", CASES, ids=[c[0] for c in CASES])
def test_each_rule_fails_on_a_bundle_built_to_break_it(name, breaker, engine, revision, rule) -> None:
    # The base passes this engine at this revision; the one change breaks exactly this rule.
    base = toy_bundle(ATTENTION) if revision == PRE_HYBRID else HYB if engine == PIPE else REC
    assert check_engine(base, engine, revision).can_drive
    got = check_engine(breaker(base), engine, revision)
    assert rule in {g.rule for g in got.failures}, [str(g) for g in got.failures]
    guard = next(g for g in got.failures if g.rule == rule)
    assert "@" in str(guard.source) and guard.condition and guard.detail


@pytest.mark.parametrize("layout, engine, revisions", [
    (RECURRENT_3, SEQ, (NOW, LATER)),
    (HYBRID, SEQ, (NOW, LATER)),
    (HYBRID, PIPE, (NOW, LATER)),
    (ATTENTION, PIPE, (PRE_HYBRID, NOW, LATER)),
])
def test_recommended_layouts_pass(layout, engine, revisions) -> None:
    for revision in revisions:
        verdict = check_engine(toy_bundle(layout), engine, revision)
        assert verdict.can_drive, [str(g) for g in verdict.failures]


def test_the_base_descriptions_pass_where_the_cases_break_them() -> None:
    assert check_engine(REC, SEQ, NOW).can_drive and check_engine(REC, SEQ, LATER).can_drive
    assert check_engine(HYB, PIPE, NOW).can_drive and check_engine(HYB, PIPE, LATER).can_drive


def test_a_ring_beside_a_fixed_state_passes() -> None:
    """LFM3's apple layout: kv, kv, sliding, fixed -- the fixed state makes every rewind a full reset."""
    conv = HYB.functions["main"].states[2]
    desc = with_states(HYB, KV + (RING, conv), {"keyCache": "kv_cache", "valueCache": "kv_cache",
                                                 "slidingCache": "sliding_cache", conv.name: "fixed"})  # fmt: skip
    for engine in (SEQ, PIPE):
        for revision in (NOW, LATER):
            verdict = check_engine(desc, engine, revision)
            assert verdict.can_drive, [str(g) for g in verdict.failures]


def test_defaults_and_static_shape() -> None:
    verdicts = {(v.engine, v.revision): v for v in check_engines(HYB)}
    assert verdicts[(PIPE, NOW)].default and not verdicts[(SEQ, NOW)].default
    assert {g.rule for g in verdicts[(STATIC_SHAPE_ENGINE, NOW)].failures} == {"factory.structure"}
    static = replace(REC, functions={**REC.functions, "extend_512_1": REC.functions["main"], "load_embeddings": FunctionDesc()})
    assert check_engine(static, STATIC_SHAPE_ENGINE, NOW).can_drive and check_engine(static, STATIC_SHAPE_ENGINE, NOW).default


def test_one_token_main_is_enough_once_prompts_go_to_prefill() -> None:
    one = with_main(REC, inputs=(replace(IDS, shape=(1, 1)), POS), outputs=(replace(LOGITS, shape=(1, 1, VOCAB)),))
    assert check_engine(one, SEQ, LATER).can_drive  # prompt chunks go to `prefill`; main sees the last token
    assert "inputs.ids_shape" in rules(replace(one, functions={"main": one.functions["main"]}), SEQ, LATER)
    assert "inputs.ids_shape" in rules(one, SEQ, NOW)  # 86b363d never calls `prefill`
    hyb = with_main(HYB, inputs=(replace(IDS, shape=(1, 1)), POS), outputs=(replace(LOGITS, shape=(1, 1, VOCAB)),))
    no_prefill = replace(hyb, functions={"main": hyb.functions["main"]})
    assert check_engine(no_prefill, PIPE, LATER).can_drive  # InputLayout chunks a static query of 1 (#227)


def test_guards_quote_the_source() -> None:
    guard = next(g for g in check_engine(toy_bundle(RECURRENT_3), PIPE, NOW).failures if g.rule == "pipelined.kv_pair")
    assert str(guard.source) == "swift/Sources/CoreAILanguageModels/InferenceEngines/CoreAIPipelinedEngine.swift:617-623@86b363d"
    assert guard.effect == THROWS and ".kvCache" in guard.condition
    prefill = next(g for g in check_engine(with_prefill(REC, outputs=(LOGITS,)), SEQ, LATER).failures if g.rule == "prefill.outputs")
    assert str(prefill.source).startswith("iannellomarco/coreai-models/swift/Sources/CoreAILanguageModels/InferenceEngines/PrefillGraph.swift:94-98@13e414e")
    assert prefill.condition == "prefillOutputs.isEmpty"
