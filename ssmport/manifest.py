"""The bundle manifest as types: one writer (`Manifest.to_json`), one reader (`Manifest.from_json`).

`manifest.json` records what the bundle is (architecture, config, source, recipe), its graph
interface as read back from the converted IR (functions, inputs, outputs, states with their
kinds and layouts), the per-tensor quantization plan, the tokenizer, export statistics and the
gate summary. Everything else in ssmport reads these fields, never the JSON keys.

Schema versions: 2 adds state kinds ("fixed" / "kv") and the KV context. Version 1 manifests
(every state fixed) are read as version 2. The "ring" kind (a sliding-window cache) needs no
new version: a reader that does not know it refuses the bundle by its kind.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from ssmport.errors import BundleError

_ITEMSIZE = {"float32": 4, "float16": 2}  # the state dtypes (ssmport.state.STATE_DTYPES)
FORMAT = "ssmport-bundle"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
DYNAMIC_DIM = -1  # a dimension each call sets (the apple layout's token and position counts)
# The state kinds (ssmport.state re-uses these): "fixed", recurrent, any length; "kv", a
# positional cache [L, 1, heads, context, head_dim]; "ring", a sliding-window cache
# [L, 1, heads, window, head_dim] whose slot p mod window holds position p (ssmport.ops.sliding):
# its size is the model's window, whatever the context.
FIXED, KV, RING = "fixed", "kv", "ring"
KINDS = (FIXED, KV, RING)
LAYOUTS = ("ssmport", "apple")  # see ssmport.apple.graph for "apple"


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]
    dtype: str

    @classmethod
    def from_json(cls, data: dict, where: str) -> TensorEntry:
        r = _Reader(data, where)
        return cls(r.str("name"), r.shape("shape"), r.str("dtype"))

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @property
    def key(self) -> tuple[str, tuple[int, ...], str]:
        """(name, shape, dtype): what an interface comparison looks at."""
        return self.name, self.shape, self.dtype


def state_problem(name: str, shape: tuple[int, ...], kind: str, max_context: int | None) -> str | None:
    """The one rule every state meets, declared (ssmport.state.StateSpec) or read from a
    manifest (StateEntry): None, or what is wrong. A kv or ring state is [layers, 1, heads,
    positions, head_dim]; only a kv or ring state's position axis (3) may be dynamic
    (DYNAMIC_DIM), and exactly then it carries a positive max_context (a ring's: its window)."""
    if kind not in KINDS:
        return f"state {name} has unknown kind {kind!r} (one of {', '.join(KINDS)})"
    if kind in (KV, RING) and (len(shape) != 5 or shape[1] != 1):
        return f"{kind} state {name} must be [layers, 1, heads, {'context' if kind == KV else 'window'}, head_dim], not {list(shape)}"
    if kind == RING and min(d for d in shape if d != DYNAMIC_DIM) < 1:
        return f"ring state {name} must be [layers, 1, heads, window, head_dim], not {list(shape)}"
    dynamic = [i for i, d in enumerate(shape) if d == DYNAMIC_DIM]
    if dynamic not in ([], [3]) or (dynamic and kind == FIXED) or bool(dynamic) != (max_context is not None) \
            or (max_context is not None and max_context < 1):
        return (f"state {name}: only a kv or ring state's position axis may be dynamic, and exactly such a state "
                "has a max_context (positive)")
    return None


@dataclass(frozen=True)
class StateEntry(TensorEntry):
    """One state of a bundle: name, shape, dtype, axis legend, kind. The one state type:
    ssmport.state.StateSpec is this with the torch dtype the graph stores it in. Constructing
    one checks `state_problem` (ValueError); `from_json` reports it as a BundleError."""

    axes: str = ""  # human-readable axis legend, e.g. "[layer, batch, head, key, value]" (JSON: "layout")
    kind: str = FIXED  # FIXED (recurrent: conv, wkv, ssm) | KV (positional cache) | RING (sliding window)
    # A kv or ring state whose position axis is dynamic (DYNAMIC_DIM: each caller sizes the
    # buffer, as Apple's engines grow their KV caches): the most positions it may hold (a ring's
    # window).
    max_context: int | None = None

    def __post_init__(self):
        problem = state_problem(self.name, self.shape, self.kind, self.max_context)
        if problem:
            raise ValueError(problem)

    @classmethod
    def from_json(cls, data: dict, where: str) -> StateEntry:
        base = TensorEntry.from_json(data, where)
        r = _Reader(data, where)
        kind, max_context = r.str("kind", FIXED), r.optional_int("max_context")
        problem = state_problem(base.name, base.shape, kind, max_context)
        if problem:
            raise BundleError(f"{where}: {problem}")
        return cls(base.name, base.shape, base.dtype, r.str("layout", ""), kind, max_context)

    def to_json(self) -> dict:
        extra = {} if self.max_context is None else {"max_context": self.max_context}
        return super().to_json() | {"layout": self.axes, "kind": self.kind} | extra

    @property
    def dynamic(self) -> bool:
        """Whether the position axis is dynamic (the caller sizes it, up to max_context)."""
        return self.max_context is not None

    @property
    def context(self) -> int | None:
        """The positions a kv state holds (None for the other kinds)."""
        if self.kind != KV:
            return None
        return self.max_context if self.dynamic else self.shape[3]

    @property
    def window(self) -> int | None:
        """The positions a ring state keeps (None for the other kinds)."""
        if self.kind != RING:
            return None
        return self.max_context if self.dynamic else self.shape[3]

    @property
    def full_shape(self) -> tuple[int, ...]:
        """The shape of a buffer holding the whole context or window (a fixed state's own shape)."""
        return with_positions(self.shape, self.max_context) if self.dynamic else self.shape


def with_positions(kv_shape: tuple[int, ...], positions: int) -> tuple[int, ...]:
    """A kv state's shape [L, 1, heads, positions, head_dim] at `positions` positions."""
    return (*kv_shape[:3], positions, *kv_shape[4:])


@dataclass(frozen=True)
class FunctionEntry:
    """One function of the asset: its name, inputs and outputs (the states are the bundle's)."""

    function: str
    inputs: tuple[TensorEntry, ...]
    outputs: tuple[TensorEntry, ...]

    @classmethod
    def from_json(cls, data: dict, where: str) -> FunctionEntry:
        r = _Reader(data, where)
        return cls(r.str("function"), r.entries("inputs", TensorEntry), r.entries("outputs", TensorEntry))

    def to_json(self) -> dict:
        return {"function": self.function, "inputs": [t.to_json() for t in self.inputs],
                "outputs": [t.to_json() for t in self.outputs]}  # fmt: skip


@dataclass(frozen=True)
class PrefillEntry(FunctionEntry):
    chunk: int = 0  # tokens per call (apple layout: the most a call may carry)
    padding: str = "valid_len"  # "valid_len": rows >= valid_len are padding, logits of row valid_len-1; "none": apple

    @classmethod
    def from_json(cls, data: dict, where: str) -> PrefillEntry:
        from ssmport.prefill import MAX_CHUNK  # here: ssmport.prefill imports torch

        base = FunctionEntry.from_json(data, where)
        r = _Reader(data, where)
        chunk = r.int("chunk")
        ids = next((t for t in base.inputs if t.name == "input_ids"), None)
        # The runner sizes its buffers from the chunk: it must be the input's (or, for a
        # dynamic token count, within the bound an export allows).
        if not 1 <= chunk <= MAX_CHUNK or ids is None or ids.shape not in ((1, chunk), (1, DYNAMIC_DIM)):
            raise BundleError(f"{where}: prefill chunk {chunk} does not match its input_ids "
                              f"{list(ids.shape) if ids else '(none)'} (expected [1, {chunk}], at most {MAX_CHUNK})")  # fmt: skip
        return cls(base.function, base.inputs, base.outputs, chunk, r.str("padding", "valid_len"))

    def to_json(self) -> dict:
        return super().to_json() | {"chunk": self.chunk, "padding": self.padding}


@dataclass(frozen=True)
class DraftEntry(PrefillEntry):
    """A checkpoint's draft head (`export --verify K` of a Qwen3.5 with `mtp.*`): a function of
    `chunk` rows of (token, the target's hidden state, position) with states of its own, which
    the target's functions never touch (ssmport.models.qwen3_5.mtp)."""

    states: tuple[StateEntry, ...] = ()

    @classmethod
    def from_json(cls, data: dict, where: str) -> DraftEntry:
        base = PrefillEntry.from_json(data, where)
        return cls(base.function, base.inputs, base.outputs, base.chunk, base.padding,
                   _Reader(data, where).entries("states", StateEntry))  # fmt: skip

    def to_json(self) -> dict:
        return super().to_json() | {"states": [s.to_json() for s in self.states]}


@dataclass(frozen=True)
class RecipeEntry:
    name: str
    description: str
    state_dtype: str


@dataclass(frozen=True)
class TokenizerEntry:
    kind: str  # "rwkv-world" | "hf-json"
    path: str  # relative to the bundle
    sha256: str
    entries: int
    origin: str | None = None
    config: str | None = None  # the checkpoint's tokenizer_config.json, copied (relative to the bundle)
    chat_template: str | None = None  # the file holding its chat template (the config or chat_template.jinja)


@dataclass(frozen=True)
class AssetEntry:
    path: str
    bytes: int
    # sha256 of every file of the asset, by path inside it: checked before the runtime reads
    # the asset (a damaged .mlirb aborts the process; a flipped weight bit runs silently).
    # Empty for bundles exported before it was recorded.
    files: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GateSummary:
    """The headline of a gate run (the whole transcript is gate.json)."""

    passed: bool
    recipe: str
    synthetic_weights: bool
    steps: int
    prompts: int
    top1_agree: int
    top1_excused_ties: int
    top1_mismatch: int
    max_abs_logit_delta: float
    max_rel_logit_delta: float
    logit_scale: float
    worst_step: dict | None
    thresholds: dict
    transcript: str = "gate.json"
    noise_floor: dict | None = None  # fp32 gates: the three distances to fp64 (ssmport.gate.report)
    recipe_split: dict | None = None  # 16-bit gates: the recipe's own error in torch with fp32 sums
    runtime_floor: dict | None = None  # 16-bit gates: the floor of fp16 sums, the limit it gives, the bundle vs its twin
    functions: list | None = None  # the functions the gate ran ("main", "prefill"); None: written before this field
    functions_not_run: list | None = None  # the bundle's functions it left out (a 16-bit export gate: "prefill")


@dataclass
class Manifest:
    """Everything `manifest.json` says about a bundle."""

    bundle_id: str
    name: str
    architecture: str
    config: dict[str, Any]
    source: dict[str, Any]  # provenance: kind, path / preset / seed (see ssmport.loader.resolve)
    synthetic_weights: bool
    recipe: RecipeEntry
    main: FunctionEntry
    states: tuple[StateEntry, ...]
    plan: dict[str, Any]  # {"summary": ..., "tensors": [PlanEntry json, ...]}
    asset: AssetEntry
    prefill: PrefillEntry | None = None
    # with `export --verify K`: the function checking K drafted tokens (ssmport.verify); its
    # chunk is K. Absent from bundles exported without it (and before it existed).
    verify: PrefillEntry | None = None
    # with a checkpoint's draft head (Qwen3.5's mtp.*) and --verify: its function and states
    draft: DraftEntry | None = None
    tokenizer: TokenizerEntry | None = None
    gate: GateSummary | None = None
    notes: list[str] = field(default_factory=list)
    export: dict[str, Any] = field(default_factory=dict)  # stage seconds, seconds, peak RSS
    ssmport_version: str = ""
    format_version: int = FORMAT_VERSION
    layout: str = "ssmport"  # "ssmport": main [1,1] + padded prefill chunks; "apple": Apple's engines' signatures

    @property
    def vocab_size(self) -> int:
        return int(self.main.outputs[0].shape[-1])  # from_json checks that there is such an output

    @property
    def plan_tensors(self) -> list[dict]:
        return self.plan["tensors"]

    @property
    def kv_states(self) -> tuple[StateEntry, ...]:
        return tuple(s for s in self.states if s.kind == KV)

    @property
    def context(self) -> int | None:
        """The positions the kv states hold (None: no kv state, any length)."""
        return min((s.context for s in self.kv_states), default=None)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes the kv states hold per position of context (0 without kv states)."""
        return sum(math.prod(with_positions(s.shape, 1)) * _ITEMSIZE[s.dtype] for s in self.kv_states)

    @property
    def ring_states(self) -> tuple[StateEntry, ...]:
        return tuple(s for s in self.states if s.kind == RING)

    @property
    def ring_bytes_per_slot(self) -> int:
        """Bytes the rings hold per slot (0 without rings): a call reads the slots allocated (a
        growing ring's, up to its window) times this."""
        return sum(math.prod(with_positions(s.shape, 1)) * _ITEMSIZE[s.dtype] for s in self.ring_states)

    @property
    def fixed_state_bytes(self) -> int:
        """Bytes of the states whose size does not depend on the context (rings included)."""
        return sum(math.prod(s.full_shape) * _ITEMSIZE[s.dtype] for s in self.states if s.kind != KV)

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "ssmport_version": self.ssmport_version,
            "bundle_id": self.bundle_id,
            "name": self.name,
            "architecture": self.architecture,
            "config": self.config,
            "source": self.source,
            "synthetic_weights": self.synthetic_weights,
            "recipe": asdict(self.recipe),
            **self.main.to_json(),
            "states": [s.to_json() for s in self.states],
            "prefill": None if self.prefill is None else self.prefill.to_json(),
            **({} if self.verify is None else {"verify": self.verify.to_json()}),
            **({} if self.draft is None else {"draft": self.draft.to_json()}),
            "plan": self.plan,
            "asset": asdict(self.asset),
            "tokenizer": None if self.tokenizer is None else asdict(self.tokenizer),
            "gate": None if self.gate is None else asdict(self.gate),
            "notes": list(self.notes),
            "export": self.export,
            "layout": self.layout,
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> Manifest:
        """Read a manifest; a missing or mistyped field is one `BundleError` naming it."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise BundleError(f"{where}: not an ssmport manifest")
        version = data.get("format_version")
        if version not in READABLE_VERSIONS:
            raise BundleError(
                f"{where}: bundle format version {version!r} is newer or older than this ssmport reads "
                f"({', '.join(map(str, READABLE_VERSIONS))}); re-export it with this ssmport"
            )
        r = _Reader(data, where)
        plan = r.dict("plan")
        summary = plan.get("summary")
        if not isinstance(plan.get("tensors"), list) or not isinstance(summary, dict):
            raise BundleError(f"{where}: field 'plan' lacks its 'summary' or 'tensors'")
        for key in ("by_role", "by_dtype"):
            if not isinstance(summary.get(key), dict) or not isinstance(summary.get("total"), (int, float)):
                raise BundleError(f"{where}: field 'plan' has no valid summary ({key!r} and 'total')")
        if not all(isinstance(t, dict) for t in plan["tensors"]):
            raise BundleError(f"{where}: field 'plan' has a tensor entry that is not an object")
        layout = r.str("layout", "ssmport")
        if layout not in LAYOUTS:
            raise BundleError(f"{where}: unknown layout {layout!r} (this ssmport knows {', '.join(LAYOUTS)})")
        prefill = r.optional_dict("prefill")
        verify = r.optional_dict("verify")
        draft = r.optional_dict("draft")
        tokenizer = r.optional_dict("tokenizer")
        gate = r.optional_dict("gate")
        notes, export = data.get("notes") or [], data.get("export") or {}
        if not isinstance(notes, list) or not isinstance(export, dict):
            raise BundleError(f"{where}: field {'notes' if not isinstance(notes, list) else 'export'!r} has the wrong type")
        main = FunctionEntry.from_json(data, where)
        if not main.outputs or not main.outputs[0].shape:
            raise BundleError(f"{where}: the decode function lists no logits output")
        return cls(
            bundle_id=r.str("bundle_id"),
            name=r.str("name"),
            architecture=r.str("architecture"),
            config=r.dict("config"),
            source=r.dict("source"),
            synthetic_weights=r.bool("synthetic_weights"),
            recipe=r.record("recipe", RecipeEntry),
            main=main,
            states=r.entries("states", StateEntry),
            plan=plan,
            asset=r.record("asset", AssetEntry),
            prefill=None if prefill is None else PrefillEntry.from_json(prefill, f"{where} (prefill)"),
            verify=None if verify is None else _verify_entry(verify, main, f"{where} (verify)"),
            draft=None if draft is None else DraftEntry.from_json(draft, f"{where} (draft)"),
            tokenizer=None if tokenizer is None else _record(tokenizer, TokenizerEntry, f"{where} (tokenizer)"),
            gate=None if gate is None else _record(gate, GateSummary, f"{where} (gate)"),
            notes=[str(n) for n in notes],
            export=dict(export),
            ssmport_version=str(data.get("ssmport_version", "")),
            format_version=int(version),
            layout=layout,
        )


def _verify_entry(data: dict, main: FunctionEntry, where: str) -> PrefillEntry:
    """The verify function's entry: logits for each of its K rows, over main's vocabulary."""
    entry = PrefillEntry.from_json(data, where)
    vocab = main.outputs[0].shape[-1]
    rows = entry.inputs[0].shape[1]
    if entry.function != "verify" or not entry.outputs or entry.outputs[0].shape != (1, rows, vocab):
        raise BundleError(f"{where}: expected function 'verify' with logits [1, {rows}, {vocab}], got "
                          f"{entry.function!r} with {[list(t.shape) for t in entry.outputs]}")  # fmt: skip
    return entry


class _Reader:
    """Typed field access on one JSON object, with errors that name the field."""

    _MISSING = object()

    def __init__(self, data: Any, where: str):
        if not isinstance(data, dict):
            raise BundleError(f"{where}: expected a JSON object")
        self.data, self.where = data, where

    def _get(self, key: str, types: tuple[type, ...], default: Any = _MISSING):
        if key not in self.data:
            if default is not self._MISSING:
                return default
            raise BundleError(f"{self.where}: missing field {key!r}")
        value = self.data[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise BundleError(f"{self.where}: field {key!r} has the wrong type ({type(value).__name__})")
        return value

    def str(self, key: str, default: Any = _MISSING) -> str:
        return self._get(key, (str,), default)

    def int(self, key: str) -> int:
        return self._get(key, (int,))

    def bool(self, key: str) -> bool:
        return self._get(key, (bool,))

    def dict(self, key: str) -> dict:
        return self._get(key, (dict,))

    def optional_dict(self, key: str) -> dict | None:
        return self._get(key, (dict, type(None)), None)

    def optional_int(self, key: str) -> int | None:
        return self._get(key, (int, type(None)), None)

    def shape(self, key: str) -> tuple[int, ...]:
        value = self._get(key, (list,))
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= DYNAMIC_DIM for d in value):
            raise BundleError(f"{self.where}: field {key!r} is not a shape")
        return tuple(value)

    def entries(self, key: str, cls) -> tuple:
        items = self._get(key, (list,))
        return tuple(cls.from_json(item, f"{self.where} ({key})") for item in items)

    def record(self, key: str, cls):
        return _record(self.dict(key), cls, f"{self.where} ({key})")


# The JSON types a flat record's fields may hold, by their annotation (this module uses
# `from __future__ import annotations`, so annotations are strings).
_JSON_TYPES = {"str": (str,), "int": (int,), "bool": (bool,), "float": (int, float), "dict": (dict,),
               "str | None": (str, type(None)), "dict | None": (dict, type(None)),
               "dict[str, str]": (dict,)}  # fmt: skip


def _record(data: dict, cls, where: str):
    """A flat dataclass from a JSON object: every field without a default must be present,
    and each must hold the JSON type its annotation says."""
    names = {f.name for f in fields(cls)}
    required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
    missing = [n for n in required if n not in data]
    if missing:
        raise BundleError(f"{where}: missing field(s) {', '.join(map(repr, missing))}")
    for f in fields(cls):
        types = _JSON_TYPES.get(str(f.type))
        value = data.get(f.name)
        if f.name in data and types and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
            raise BundleError(f"{where}: field {f.name!r} has the wrong type ({type(value).__name__})")
    try:
        return cls(**{k: v for k, v in data.items() if k in names})
    except TypeError as exc:
        raise BundleError(f"{where}: {exc}") from None

