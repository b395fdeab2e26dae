"""Which of Apple's engines can drive a bundle, and the exact guard each other one fails.

Every rule is written from the Swift source (see `sources` for the revisions) and cites the
lines it checks, quoting the condition. A failed rule is either ``throws`` (the loader or the
engine's init stops there) or ``misdrives`` (it loads, but produces wrong tokens in the
situation the detail names). Rules read only a `BundleDesc`, so they run on any bundle, or
on a description written to break one of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .description import BundleDesc, FunctionDesc, TensorDesc
from .sources import (
    ENGINE_FACTORY,
    FORK_PREFILL,
    INPUT_LAYOUT,
    KV_CACHE,
    LANGUAGE_BUNDLE,
    LANGUAGE_CONFIG,
    MAIN_86B363D,
    MODEL_BUNDLE,
    MTL_STATE,
    NDARRAY_STATE,
    PIPELINED,
    PRE_HYBRID,
    PREFILL_GRAPH,
    PREFILL_GRAPH_COMMIT,
    PREFILL_GRAPH_FILE,
    REVISIONS,
    SEQUENTIAL,
    STATE_FACTORY,
    STATE_FACTORY_LATER,
    STATIC_STATE,
    STATIC_STATE_COMMIT,
    TOKEN_INPUT,
    SWIFT_TRANSFORMERS,
    SWIFT_TRANSFORMERS_COMMIT,
    SWIFT_TRANSFORMERS_TOKENIZER,
    Citation,
    cite,
)
from .state_kinds import FIXED, HEURISTIC, KV_CACHE as KV, LEGACY_RULE, SLIDING_CACHE, classify, has_non_truncatable

SEQUENTIAL_ENGINE, PIPELINED_ENGINE, STATIC_SHAPE_ENGINE = "coreai-sequential", "coreai-pipelined", "static-shape"
ENGINES = (SEQUENTIAL_ENGINE, PIPELINED_ENGINE, STATIC_SHAPE_ENGINE)
THROWS, MISDRIVES = "throws", "misdrives"

PREFILL_FUNCTION = "prefill"  # PrefillGraph.swift:11@13e414e: prefillGraphFunctionName
STATE_DTYPES = ("float16", "bfloat16", "float32")
STATE_KIND_NAMES = ("kv_cache", "sliding_cache", "fixed")
BUNDLE_KINDS = ("llm", "vlm", "diffusion", "segmenter", "speech_recognizer")
# swift-transformers picks the tokenizer by tokenizer_config's class, "Fast" removed.
SWIFT_TOKENIZER_CLASSES = {
    "BertTokenizer": "WordPiece", "DistilbertTokenizer": "WordPiece", "DistilBertTokenizer": "WordPiece",
    "RobertaTokenizer": "BPE", "CodeGenTokenizer": "BPE", "CodeLlamaTokenizer": "BPE", "FalconTokenizer": "BPE",
    "GemmaTokenizer": "BPE", "GPT2Tokenizer": "BPE", "LlamaTokenizer": "BPE", "T5Tokenizer": "Unigram",
    "WhisperTokenizer": "BPE", "CohereTokenizer": "BPE", "Qwen2Tokenizer": "BPE", "PreTrainedTokenizer": "BPE",
}  # fmt: skip
INPUT_ID_NAMES, POSITION_ID_NAMES, ATTN_MASK_NAMES = ("input_ids", "in_new_token_ids"), ("position_ids", "pos_ids"), ("attn_mask",)


@dataclass(frozen=True)
class Guard:
    """One guard a bundle fails: the rule, where it is, its condition as written, what happens."""

    rule: str
    source: Citation
    condition: str
    effect: str  # THROWS | MISDRIVES
    detail: str

    def __str__(self) -> str:
        return f"{self.rule} [{self.effect}] {self.source}: `{self.condition}` -- {self.detail}"


@dataclass(frozen=True)
class Verdict:
    engine: str
    revision: str
    failures: tuple[Guard, ...]
    default: bool  # what EngineFactory picks when no variant is named

    @property
    def can_drive(self) -> bool:
        return not self.failures

    @property
    def loads(self) -> bool:
        return not any(f.effect == THROWS for f in self.failures)


def check_engines(desc: BundleDesc, revisions: tuple[str, ...] = REVISIONS) -> list[Verdict]:
    """A verdict per engine and revision."""
    return [check_engine(desc, engine, revision) for revision in revisions for engine in ENGINES]


def check_engine(desc: BundleDesc, engine: str, revision: str) -> Verdict:
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    if revision not in REVISIONS:
        raise ValueError(f"unknown revision {revision!r}; known: {', '.join(REVISIONS)}")
    failures = list(_loader(desc)) + list(_tokenizer(desc))
    chunked_static = _is_chunked_static(desc)
    if engine == STATIC_SHAPE_ENGINE:
        if not chunked_static:
            failures.append(Guard(
                "factory.structure", cite(ENGINE_FACTORY, 387, 388), "case (.staticShape, .dynamic): return (false, ...)",
                THROWS, "the static-shape engine needs extend_* and load_embeddings functions (a chunked static asset)"))
        # Beyond the structure, the static-shape engine (Neural Engine, extend_* graphs) is not modelled here.
    elif chunked_static:
        failures.append(Guard(
            "factory.structure", cite(ENGINE_FACTORY, 389, 392),
            "case (.pipelined, .chunkedStatic) / (.sequential, .chunkedStatic): return (false, ...)",
            THROWS, "extend_* and load_embeddings make this a chunked static asset"))
    else:
        main = desc.functions.get(desc.main_name)
        if main is None:
            where = cite(SEQUENTIAL, 104, 107) if engine == SEQUENTIAL_ENGINE else cite(PIPELINED, 593, 596)
            failures.append(Guard("engine.function", where, "model.functionDescriptor(for: config.function) != nil", THROWS,
                                  f"the asset has no function {desc.main_name!r} (functions: {sorted(desc.functions)})"))
        else:
            check = _sequential if engine == SEQUENTIAL_ENGINE else _pipelined
            failures.extend(check(desc, main, revision))
    default = engine == (STATIC_SHAPE_ENGINE if chunked_static else PIPELINED_ENGINE)
    return Verdict(engine, revision, tuple(failures), default)


# -- loading the bundle (the same at every revision read) ---------------------------------------


def _loader(desc: BundleDesc) -> Iterator[Guard]:
    meta = desc.metadata
    if meta is None:
        yield Guard("bundle.metadata", cite(MODEL_BUNDLE, 152, 155), "FileManager.default.fileExists(atPath: metadataURL.path)",
                    THROWS, "no metadata.json in the bundle directory")
        return
    version = meta.get("metadata_version", "0.1")
    if version != "0.2":
        yield Guard("bundle.version", cite(MODEL_BUNDLE, 178, 181), 'guard version == "0.2"', THROWS,
                    f"metadata_version is {version!r} (absent counts as '0.1')")
    if meta.get("kind") not in BUNDLE_KINDS or not isinstance(meta.get("name"), str):
        yield Guard("bundle.common", cite(MODEL_BUNDLE, 209, 219), "kind: BundleKind, name: String (Decodable)", THROWS,
                    f"kind {meta.get('kind')!r} / name {meta.get('name')!r} do not decode")
    elif meta["kind"] not in ("llm", "vlm"):
        yield Guard("bundle.kind", cite(LANGUAGE_BUNDLE, 36, 38), "bundle.kind == .llm || bundle.kind == .vlm", THROWS,
                    f"kind is {meta['kind']!r}")
    assets = meta.get("assets") if isinstance(meta.get("assets"), dict) else {}
    main_asset = assets.get("main")
    if not isinstance(main_asset, str):
        yield Guard("bundle.assets.main", cite(LANGUAGE_BUNDLE, 41, 43), "let main = payload.assets.main", THROWS,
                    "metadata.json has no assets.main")
    elif not _asset_present(desc, main_asset):
        yield Guard("bundle.asset.exists", cite(MODEL_BUNDLE, 82, 89), "FileManager.default.fileExists(atPath: url.path)", THROWS,
                    f"assets.main {main_asset!r} is not in the bundle (nor {main_asset + 'c'!r})")
    lang = meta.get("language")
    if not isinstance(lang, dict):
        yield Guard("bundle.language", cite(LANGUAGE_BUNDLE, 44, 46), "let language = payload.language", THROWS,
                    "metadata.json has no language block")
        return
    wrong = [k for k, t in (("tokenizer", str), ("vocab_size", int), ("max_context_length", int)) if not _is(lang.get(k), t)]
    if wrong:
        yield Guard("bundle.language.fields", cite(LANGUAGE_CONFIG, 62, 64),
                    "decode(String, .tokenizer), decode(Int, .vocabSize), decode(Int, .maxContextLength)", THROWS,
                    f"language.{', language.'.join(wrong)} missing or of the wrong type")
    if "embedded_tokenizer" in lang and not isinstance(lang["embedded_tokenizer"], bool):
        yield Guard("bundle.language.fields", cite(LANGUAGE_CONFIG, 65), "decodeIfPresent(Bool.self, forKey: .embeddedTokenizer)",
                    THROWS, "language.embedded_tokenizer is not a boolean")
    fmap = lang.get("function_map")
    if fmap is not None and not (isinstance(fmap, dict) and all(_is_str_list(v) for v in fmap.values())):
        yield Guard("bundle.language.fields", cite(LANGUAGE_CONFIG, 66), "decodeIfPresent(FunctionMap.self, ...) -- [String: [String]]",
                    THROWS, "language.function_map is not a map of name lists")
    states = lang.get("states")
    if states is not None and not (isinstance(states, dict) and all(v in STATE_KIND_NAMES for v in states.values())):
        yield Guard("bundle.language.fields", cite(LANGUAGE_CONFIG, 68), "decodeIfPresent([String: StateKind].self, forKey: .states)",
                    THROWS, f"language.states values must be one of {STATE_KIND_NAMES}")


def _tokenizer(desc: BundleDesc) -> Iterator[Guard]:
    lang = desc.language
    if lang.get("embedded_tokenizer", True) is not True or "tokenizer/tokenizer.json" not in desc.files:
        yield Guard("tokenizer.embedded", cite(LANGUAGE_BUNDLE, 82, 98),
                    "language.embeddedTokenizer && fileExists(tokenizer/tokenizer.json), else AutoTokenizer.from(pretrained:)",
                    THROWS, f"no embedded tokenizer: it downloads {lang.get('tokenizer')!r} from the Hugging Face Hub "
                    "(fails offline, or loads that repository's tokenizer)")
        return
    config = desc.tokenizer_config
    cls = config.get("tokenizer_class") if config else None
    if not isinstance(cls, str) or cls.replace("Fast", "") not in SWIFT_TOKENIZER_CLASSES:
        yield Guard("tokenizer.class", cite(SWIFT_TRANSFORMERS_TOKENIZER, 124, 133, SWIFT_TRANSFORMERS_COMMIT, SWIFT_TRANSFORMERS),
                    'knownTokenizers[tokenizerClassName.replacingOccurrences(of: "Fast", with: "")] != nil', THROWS,
                    "tokenizer/tokenizer_config.json missing or its tokenizer_class is not one swift-transformers knows "
                    f"(got {cls!r})")
    elif SWIFT_TOKENIZER_CLASSES[cls.replace("Fast", "")] == "BPE" and not desc.tokenizer_has_merges:
        yield Guard("tokenizer.merges", cite("Sources/Tokenizers/BPETokenizer.swift", 69, None, "060c8d4", SWIFT_TRANSFORMERS),
                    "guard let merges = Self.mergesFromConfig(tokenizerData.model.merges) else { fatalError(...) }", THROWS,
                    f"tokenizer_class {cls!r} runs swift-transformers' BPE, which needs model.merges in tokenizer.json")


# -- the sequential engine -------------------------------------------------------------------------


def _sequential(desc: BundleDesc, main: FunctionDesc, revision: str) -> Iterator[Guard]:
    n_in = len(main.inputs)
    names = [t.name for t in main.inputs]
    if revision == PREFILL_GRAPH:
        if not (n_in == 2 or (n_in == 3 and any(n in ATTN_MASK_NAMES for n in names))):
            yield Guard("sequential.inputs", _stored(SEQUENTIAL), "inputNames.count == 2 || (count == 3 && hasAttnMask)", THROWS,
                        f"{n_in} inputs {names}")
    elif n_in != 2:
        line = (113, 116) if revision == PRE_HYBRID else (112, 115)
        yield Guard("sequential.inputs", cite(SEQUENTIAL, *line, commit=revision), "descriptor.inputNames.count == 2", THROWS,
                    f"{n_in} inputs {names}")
    if not main.outputs:
        yield Guard("sequential.outputs", cite(SEQUENTIAL, 116, 119), "descriptor.outputNames.count >= 1", THROWS, "no outputs")
    n_states = len(main.states)
    if revision == PRE_HYBRID and n_states != 2:
        yield Guard("sequential.states", cite(SEQUENTIAL, 121, 125, commit=PRE_HYBRID), "descriptor.stateNames.count == 2",
                    THROWS, f"{n_states} states")
    elif revision != PRE_HYBRID and not 2 <= n_states <= 4:
        yield Guard("sequential.states", cite(SEQUENTIAL, 120, 124), "stateNames.count >= 2 && stateNames.count <= 4", THROWS,
                    f"{n_states} states")
    yield from _io_contract(desc, main, revision, SEQUENTIAL_ENGINE)
    yield from _state_contract(desc, main, revision, SEQUENTIAL_ENGINE)
    yield from _prefill_function(desc, main, revision)


def _pipelined(desc: BundleDesc, main: FunctionDesc, revision: str) -> Iterator[Guard]:
    names = [t.name for t in main.inputs]
    if len(names) != 2:
        line = (469, 472) if revision == PRE_HYBRID else (599, 602)
        yield Guard("pipelined.inputs", cite(PIPELINED, *line, commit=_commit(revision)), "descriptor.inputNames.count == 2",
                    THROWS, f"{len(names)} inputs {names}")
    if not main.outputs:
        yield Guard("pipelined.outputs", cite(PIPELINED, 603, 606), "descriptor.outputNames.count >= 1", THROWS, "no outputs")
    n_states = len(main.states)
    if revision == PRE_HYBRID and n_states != 2:
        yield Guard("pipelined.states", cite(PIPELINED, 477, 481, commit=PRE_HYBRID), "descriptor.stateNames.count == 2", THROWS,
                    f"{n_states} states")
    elif revision != PRE_HYBRID and not 2 <= n_states <= 4:
        yield Guard("pipelined.states", cite(PIPELINED, 607, 611), "stateNames.count >= 2 && stateNames.count <= 4", THROWS,
                    f"{n_states} states")
    kinds = classify(main, revision)
    kv = [n for n, k in kinds.items() if k == KV]
    if revision != PRE_HYBRID and len(kv) < 2:
        yield Guard("pipelined.kv_pair", cite(PIPELINED, 617, 623),
                    "classified.filter { $0.kind == .kvCache }.count >= 2", THROWS,
                    f"states classify as {kinds}: the pipelined engine needs two growing KV states")
    yield from _io_contract(desc, main, revision, PIPELINED_ENGINE)
    yield from _state_contract(desc, main, revision, PIPELINED_ENGINE)
    yield from _prefill_function(desc, main, revision)


# -- shared by both engines -------------------------------------------------------------------------


def _io_contract(desc: BundleDesc, main: FunctionDesc, revision: str, engine: str) -> Iterator[Guard]:
    seq = engine == SEQUENTIAL_ENGINE
    ids, pos = input_roles(main, revision)
    if revision == PREFILL_GRAPH and (ids is None or pos is None):
        yield Guard("inputs.names", cite(INPUT_LAYOUT, 112, 115, commit=STATE_FACTORY_LATER),
                    "resolveRequired(from: inputNames, candidates: knownInputIdNames / knownPositionIdNames)", THROWS,
                    f"inputs {[t.name for t in main.inputs]} lack one of {INPUT_ID_NAMES} / {POSITION_ID_NAMES}")
    for role, tensor, line in (("token ids", ids, 243), ("position ids", pos, 250)):
        if tensor is not None and tensor.dtype != "int32":
            yield Guard("inputs.dtype", cite(SEQUENTIAL, line) if seq else cite(PIPELINED, 904, 929),
                        "fillNDArray(&array, as: Int32.self, ...) / AsyncValue(scalarType: .int32)", THROWS,
                        f"{tensor.name} (the {role}) is {tensor.dtype}; the engine writes int32")
    if pos is not None and (len(pos.shape) != 2 or pos.shape[1] is not None):
        yield Guard("inputs.position_shape", cite(SEQUENTIAL, 245, 250) if seq else cite(PIPELINED, 896, 929),
                    "positionIds: [1, processedTokenCount + batchSize]", THROWS,
                    f"{pos.name} is {_shape(pos)}; the engines pass the whole history [0, ..., n-1], so dim 1 must be dynamic")
    batch_src = cite(SEQUENTIAL, 238, 243) if seq else cite(PIPELINED, 899, 900)
    if ids is not None and (len(ids.shape) != 2 or ids.shape[1] not in (None, 1)):
        yield Guard("inputs.ids_shape", batch_src, "input_ids: [1, batchSize]", THROWS,
                    f"{ids.name} is {_shape(ids)}; the engines pass [1, T] token batches")
        return
    whole_prompts = _main_takes_prompts(desc, main, revision, engine)
    if ids is not None and ids.shape[1] == 1 and whole_prompts:
        yield Guard("inputs.ids_shape", cite(SEQUENTIAL, 211, 216) if seq else cite(PIPELINED, 1155, 1169),
                    "newTokenCount > config.chunkThreshold ? .chunked(prefillChunkSize) : .wholeBatch", THROWS,
                    f"{ids.name} is [1, 1], but a prompt of T > 1 tokens reaches {desc.main_name!r} as one [1, T] call "
                    "(unless the app sets COREAI_CHUNK_THRESHOLD=1)")
    if not main.outputs:
        return
    logits = main.outputs[0]
    if logits.dtype != "float16":
        yield Guard("logits.dtype", cite(SEQUENTIAL, 146, 149) if seq else cite(PIPELINED, 659, 662),
                    "logitsDesc.scalarType == .float16", THROWS, f"{logits.name} is {logits.dtype}")
    vocab = desc.language.get("vocab_size")
    rows_ok = logits.shape[1] is None or (logits.shape[1] == 1 and not whole_prompts) if len(logits.shape) == 3 else False
    if len(logits.shape) != 3 or not rows_ok or logits.shape[2] not in (None, vocab):
        yield Guard("logits.shape", cite(SEQUENTIAL, 253, 271) if seq else cite(PIPELINED, 958, 990),
                    "logits: [1, batchSize, vocabSize]; the last row is read at (batchSize - 1) * vocabSize", MISDRIVES,
                    f"{logits.name} is {_shape(logits)}: it must hold one row of language.vocab_size ({vocab}) logits "
                    f"per input token{' (prompts reach it whole)' if whole_prompts else ''}")
    elif logits.shape[1] == 1 and not seq and revision != PREFILL_GRAPH:
        yield Guard("logits.shape", cite(PIPELINED, 745, 752), "GrowingLogitsBuffer(initialCapacity: averageExpectedPromptSize)",
                    THROWS, "a static [1, 1, V] logits output cannot back the 256-row logits buffer (issue #212, fixed by #227)")


def _main_takes_prompts(desc: BundleDesc, main: FunctionDesc, revision: str, engine: str) -> bool:
    """Whether prompts of T > 1 tokens reach the main function in one call."""
    if revision != PREFILL_GRAPH:
        return True
    if _valid_prefill(desc, main):
        return False  # prompt chunks go to `prefill`; main sees the held-back last token
    ids, _ = input_roles(main, revision)
    # The pipelined engine chunks at a static query length (InputLayout.swift:132-133@34ab73d).
    return not (engine == PIPELINED_ENGINE and ids is not None and len(ids.shape) == 2 and ids.shape[1] == 1)


def _state_contract(desc: BundleDesc, main: FunctionDesc, revision: str, engine: str) -> Iterator[Guard]:
    seq = engine == SEQUENTIAL_ENGINE
    for s in main.states:
        if s.dtype not in STATE_DTYPES:
            yield Guard("states.dtype", cite(NDARRAY_STATE, 188, 203) if seq else cite(MTL_STATE, 24, 37),
                        "switch array.scalarType { case .float16, .bfloat16: ...; case .float32: ...; default: preconditionFailure }",
                        THROWS, f"{s.name} is {s.dtype}")
    kinds = classify(main, revision)
    declared = desc.language.get("states") if isinstance(desc.language.get("states"), dict) else {}
    source, condition = _kind_source(main, revision, engine), _kind_condition(main, revision)
    for name, kind in kinds.items():
        intended = declared.get(name)
        if intended is not None and intended != kind:
            yield Guard("states.kind", source, condition, MISDRIVES,
                        f"{name} is declared {intended} in language.states (which the engines never read) but this "
                        f"revision takes it as {kind}{_kind_consequence(intended)}")
        elif intended is None and kind == KV and not main.state(name).is_dynamic:
            s = main.state(name)
            cap = f"; the pipelined engine caps the context at its dim {s.shape[3 if len(s.shape) == 5 else 2]}" if not seq and len(s.shape) > 2 else ""
            yield Guard("states.kv_static", source, condition, MISDRIVES,
                        f"{name} {_shape(s)} has no dynamic dimension yet is taken as a KV cache{_kind_consequence(FIXED)}{cap}")
    yield from _ring_contract(main, kinds, declared, revision, seq)
    kv = [main.state(n) for n, k in kinds.items() if k == KV]
    if not kv:
        return
    if seq:
        first = _dynamic_dims(kv[0])
        for s in kv:
            dims = _dynamic_dims(s)
            if len(dims) > 1 or (first and dims != first):
                yield Guard("states.kv_layout", cite(NDARRAY_STATE, 85), "sequenceDimIndex = firstDesc.shape.firstIndex(where: { $0 < 0 })",
                            MISDRIVES, f"{s.name} {_shape(s)}: growth copies along the first KV state's dynamic dim "
                            f"{first}, so every KV state needs exactly that one dynamic dim")
    else:
        for s in kv[:2]:
            seq_dim = 3 if len(s.shape) == 5 else 2
            if len(s.shape) <= seq_dim or s.shape[seq_dim] is not None or len(_dynamic_dims(s)) != 1:
                yield Guard("states.kv_layout", cite(KV_CACHE, 95, 106), "shape.count == 5 ? 3 : 2 is the sequence dim; dynamic there or a StaticKVCache of that size",
                            MISDRIVES, f"{s.name} {_shape(s)}: the pipelined KV pair must be [L, B, H, S?, D] (or [B, H, S?, D]) "
                            "with only S dynamic; otherwise the context is capped at that dim and the value "
                            "state is re-shaped by the key's sequence dim")


def _ring_contract(main: FunctionDesc, kinds: dict[str, str], declared: dict, revision: str, seq: bool) -> Iterator[Guard]:
    """A ring (a state language.states declares sliding_cache: ssmport's sliding-window ring,
    W slots written at position mod W) under the dynamic engines' handling of that kind."""
    rings = [n for n, k in kinds.items() if k == SLIDING_CACHE and declared.get(n) == SLIDING_CACHE]
    if rings and not has_non_truncatable(kinds):
        yield Guard("states.ring_rewind", cite(STATE_FACTORY, 130, 138),
                    "case .slidingCache: fixedPairs.append(...) -- only .fixed sets hasNonTruncatable", MISDRIVES,
                    f"{', '.join(rings)}: a sliding cache is rewound by moving the cursor, and no fixed state forces a "
                    "full reset instead; a ring of W slots still holds the keys the next token needs only after a "
                    "rewind of one token (a re-sent prompt), not a deeper one (a shortened prompt, reset(to:), a "
                    f"diverging turn). The static-shape engine checks this (SlidingRing.allowsRewind, {STATIC_STATE}"
                    f"@{STATIC_STATE_COMMIT}: processed - target <= depth - window + 1); the dynamic engines do not")
    if revision == PREFILL_GRAPH and seq and kinds and all(k == SLIDING_CACHE for k in kinds.values()):
        yield Guard("states.all_sliding", cite(STATE_FACTORY, 0, commit=STATE_FACTORY_LATER),
                    "isAllSlidingCache: classified.allSatisfy { $0.kind == .slidingCache } -> useCompactPositionIds",
                    MISDRIVES, f"every state is a sliding cache, so position_ids carry only the new tokens' positions "
                    f"[processed ..< processed + T] ({TOKEN_INPUT}), not the whole history the graph reads its "
                    "positions from")


def _valid_prefill(desc: BundleDesc, main: FunctionDesc) -> bool:
    return PREFILL_FUNCTION in desc.functions and not any(_prefill_function(desc, main, PREFILL_GRAPH))


def _prefill_function(desc: BundleDesc, main: FunctionDesc, revision: str) -> Iterator[Guard]:
    prefill = desc.functions.get(PREFILL_FUNCTION)
    if prefill is None or revision != PREFILL_GRAPH:
        return  # before the prefill graph, a `prefill` function is never loaded
    src = lambda a, b=None: cite(PREFILL_GRAPH_FILE, a, b, PREFILL_GRAPH_COMMIT, FORK_PREFILL)  # noqa: E731
    if [t.name for t in prefill.inputs] != [t.name for t in main.inputs]:
        yield Guard("prefill.inputs", src(84, 88), "prefillInputs == mainInputs", THROWS,
                    f"prefill inputs {[t.name for t in prefill.inputs]} != main inputs {[t.name for t in main.inputs]}")
    if {t.name for t in prefill.states} != {t.name for t in main.states}:
        yield Guard("prefill.states", src(89, 93), "Set(prefillStates) == Set(mainStates)", THROWS,
                    f"prefill states {sorted(t.name for t in prefill.states)} != main states {sorted(t.name for t in main.states)}")
    if prefill.outputs:
        yield Guard("prefill.outputs", src(94, 98), "prefillOutputs.isEmpty", THROWS,
                    f"prefill declares outputs {[t.name for t in prefill.outputs]}; expected none")
    ids, _ = input_roles(prefill, revision)
    if ids is not None and (len(ids.shape) != 2 or ids.shape[1] is not None):
        yield Guard("prefill.ids_shape", src(61, 69), "prefillChunkSizes(tokenCount:chunkSize:heldBack:) -- chunks of up to prefillChunkSize",
                    THROWS, f"prefill {ids.name} is {_shape(ids)}; prompt chunks arrive as [1, T] with T varying")


# -- helpers --------------------------------------------------------------------------------------------


def input_roles(fn: FunctionDesc, revision: str) -> tuple[TensorDesc | None, TensorDesc | None]:
    """The token-id and position inputs: by name in the prefill-graph revision (InputLayout),
    by position before (inputNames[0], inputNames[1])."""
    if revision == PREFILL_GRAPH:
        find = lambda names: next((t for n in names for t in fn.inputs if t.name == n), None)  # noqa: E731
        return find(INPUT_ID_NAMES), find(POSITION_ID_NAMES)
    return (fn.inputs[0] if fn.inputs else None), (fn.inputs[1] if len(fn.inputs) > 1 else None)


def _kind_source(main: FunctionDesc, revision: str, engine: str) -> Citation:
    if revision == PRE_HYBRID:
        return cite(SEQUENTIAL, 130, 131, commit=PRE_HYBRID) if engine == SEQUENTIAL_ENGINE else cite(PIPELINED, 485, 486, commit=PRE_HYBRID)
    if revision == MAIN_86B363D and len(main.states) == 2:
        return LEGACY_RULE
    return HEURISTIC[revision]


def _kind_condition(main: FunctionDesc, revision: str) -> str:
    if revision == PRE_HYBRID:
        return "keyCacheName = stateNames[0]; valueCacheName = stateNames[1]"
    if revision == MAIN_86B363D and len(main.states) == 2:
        return "if names.count == 2 { return names.map { ($0, .kvCache) } }"
    return 'hasDynamicDim ? .kvCache : (name contains "cache" or "kv") ? .slidingCache : .fixed'


def _kind_consequence(intended: str) -> str:
    if intended == FIXED:
        return ": the engine then rewinds it by moving a cursor (a re-sent or shortened prompt, reset(to:)) instead of a full reset"
    return ": the engine allocates and rewinds it as the wrong kind"


def _is_chunked_static(desc: BundleDesc) -> bool:
    """ModelStructure.detectStructure (ModelStructure.swift:244-248@86b363d)."""
    return any(n.startswith("extend") for n in desc.functions) and "load_embeddings" in desc.functions


def _asset_present(desc: BundleDesc, path: str) -> bool:
    return any(f == p or f.startswith(p + "/") for f in desc.files for p in (path, path + "c"))


def _dynamic_dims(t: TensorDesc) -> tuple[int, ...]:
    return tuple(i for i, d in enumerate(t.shape) if d is None)


def _shape(t: TensorDesc) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in t.shape) + "]"


def _is(value, kind) -> bool:
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


def _is_str_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _commit(revision: str) -> str:
    return PRE_HYBRID if revision == PRE_HYBRID else MAIN_86B363D


def _stored(path: str) -> Citation:
    """A file read only as a stored copy whose commit the index does not expose."""
    return Citation(path, 0, 0, "stored copy after 86b363d")

