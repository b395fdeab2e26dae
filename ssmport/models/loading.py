"""What every architecture's loader shares: typed, bounded reads of config.json values, the
one-line refusal of an option ssmport does not support, the tied-head rule, the layer count
read from tensor names, and the strictly checked canonical-name view of a checkpoint.

Bounds are checked before anything is sized from a value: a layer count of 10^9 or a width
of 10^12 in a damaged config.json is refused in one line naming the key, instead of being
allocated for minutes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ssmport.loader.checkpoint import MappedSource, TensorSource, check_strict
from ssmport.errors import CheckpointError

MAX_LAYERS = 1024  # the deepest released models have ~128
MAX_DIM = 1 << 20  # widths, heads, vocab rows (the largest vocabularies are ~262k)
_MISSING = object()


@dataclass(frozen=True)
class Stored:
    """How a checkpoint stores one canonical tensor: the shapes it may have there, given the
    canonical shape (the first is the one an error reports), and how it reads back as the
    canonical fp32 tensor."""

    shapes: Callable[[tuple[int, ...]], tuple[tuple[int, ...], ...]]
    read: Callable[[torch.Tensor], torch.Tensor]

    def expected(self, canonical: tuple[int, ...], present: tuple[int, ...] | None) -> tuple[int, ...]:
        options = self.shapes(tuple(canonical))
        return present if present in options else options[0]


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.float().reshape(-1)


AS_IS = Stored(lambda s: (s,), lambda t: t.float())
TRANSPOSED = Stored(lambda s: (s[::-1],), lambda t: t.float().t())
# nn.Conv1d's depthwise weight [C, 1, K], read as [C, K]
DEPTHWISE_CONV = Stored(lambda s: ((s[0], 1, s[1]),), lambda t: t.float().reshape(t.shape[0], t.shape[-1]))
UNSQUEEZED = Stored(lambda s: ((1, 1, *s),), _flat)  # a vector saved [1, 1, C]
FLAT_OR_UNSQUEEZED = Stored(lambda s: (s, (1, 1, *s)), _flat)  # either, as library versions differ


def stacked_row(row: int, rows: int) -> Stored:
    """One canonical vector kept as row `row` of a [rows, C] checkpoint tensor."""
    return Stored(lambda s: ((rows, *s),), lambda t: t.float().reshape(rows, -1)[row])


class ConfigReader:
    """Typed access to one config.json object; every error names the file and the key."""

    def __init__(self, data: Mapping[str, Any], origin: str, family: str, defaults: Mapping[str, Any] | None = None):
        self.data, self.origin, self.family = data, origin, family
        self.defaults = dict(defaults or {})

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        if key in self.data:
            return self.data[key]
        if key in self.defaults:
            return self.defaults[key]
        if default is _MISSING:
            raise CheckpointError(f"{self.origin}: config.json lacks {key!r}")
        return default

    def int(self, key: str, default: Any = _MISSING, *, lo: int = 1, hi: int = MAX_DIM) -> int:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value != int(value):
            raise CheckpointError(f"{self.origin}: config.json {key}={value!r} is not a whole number")
        if not lo <= int(value) <= hi:
            raise CheckpointError(f"{self.origin}: config.json {key}={int(value)} is outside [{lo}, {hi}]")
        return int(value)

    def layers(self, key: str, default: Any = _MISSING) -> int:
        return self.int(key, default, hi=MAX_LAYERS)

    def size(self, what: str, value: Any) -> int:
        """A size computed from config values (`what` says how, e.g. "head_dim*expand_v"),
        bounded like a read one: huge factors must not turn into huge shapes."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise CheckpointError(f"{self.origin}: config.json {what}={value!r} is not a whole number")
        if not 1 <= value <= MAX_DIM or value != int(value):
            raise CheckpointError(f"{self.origin}: config.json {what}={value:g} is not a whole number in [1, {MAX_DIM}]")
        return int(value)

    def float(self, key: str, default: Any = _MISSING, *, positive: bool = False, finite: bool = True) -> float:
        value = json_float(self.raw(key, default), f"{self.origin}: config.json {key}")
        if (finite and not math.isfinite(value)) or math.isnan(value) or (positive and not value > 0):
            kind = "a positive number" if positive else "a finite number"
            raise CheckpointError(f"{self.origin}: config.json {key}={value!r} is not {kind}")
        return value

    def bool(self, key: str, default: Any = _MISSING) -> bool:
        value = self.raw(key, default)
        if value is None and default is not _MISSING:  # null: the library's default, as its loaders read it
            value = default
        if not isinstance(value, bool):
            raise CheckpointError(f"{self.origin}: config.json {key}={value!r} is not true or false")
        return value

    def unsupported(self, what: str) -> CheckpointError:
        return unsupported(self.origin, self.family, what)

    def refuse(self, checks: Mapping[str, bool]) -> None:
        """Raise `unsupported` for the first check that is True ({description: present})."""
        refuse(self.origin, self.family, checks)


def unsupported(origin: str, family: str, what: str) -> CheckpointError:
    return CheckpointError(f"{origin}: {family} config with {what} is not supported")


def refuse(origin: str, family: str, checks: Mapping[str, bool]) -> None:
    """Raise `unsupported` for the first check that is True ({description: present}); also for
    a config already built (its `validate`), where there is no reader."""
    for what, present in checks.items():
        if present:
            raise unsupported(origin, family, what)


def json_float(value: Any, what: str) -> float:
    """A float from config.json: a number, Python's `Infinity`, or transformers 5's
    `{"__float__": "Infinity"}` (how it writes non-finite floats)."""
    if isinstance(value, Mapping) and set(value) == {"__float__"} and isinstance(value["__float__"], str):
        try:
            return float(value["__float__"])
        except ValueError:
            raise CheckpointError(f"{what}={value!r} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):  # "1e-5" (a string) is refused too
        raise CheckpointError(f"{what}={value!r} is not a number")
    return float(value)


def dt_limit(r: ConfigReader, key: str) -> tuple[float, float | None]:
    """A Mamba-2 dt clamp (lo, hi) from config.json (`time_step_limit`, mamba_ssm's `dt_limit`),
    hi = None for "no upper bound" (JSON cannot say inf portably); absent or null: (0, None)."""
    limit = r.raw(key, None)
    if limit is None:
        return 0.0, None
    if not isinstance(limit, (list, tuple)) or len(limit) != 2:
        raise CheckpointError(f"{r.origin}: time_step_limit / dt_limit {limit!r} is not a pair of numbers")
    lo, hi = (json_float(v, f"{r.origin}: config.json {key}") for v in limit)
    if math.isnan(lo) or math.isnan(hi) or lo < 0 or hi < lo:
        raise CheckpointError(f"{r.origin}: config.json {key}={limit!r} is not a range 0 <= lo <= hi")
    return lo, (None if math.isinf(hi) else hi)


def head_name(tied: bool, source, head: str, embedding: str) -> str:
    """The checkpoint tensor the LM head is read from: a tied model's embedding, unless the
    file carries its own head anyway (some tied checkpoints do; then it is the head)."""
    return embedding if tied and head not in source else head


def layer_count(source, prefix: str) -> int:
    """1 + the highest layer index in the checkpoint's tensor names `{prefix}N.*` (0 if none)."""
    present = {int(n[len(prefix) :].split(".", 1)[0]) for n in source if n.startswith(prefix) and n[len(prefix) :].split(".", 1)[0].isdigit()}
    return max(present) + 1 if present else 0


def check_layer_count(layers: int, source, prefix: str, origin: str) -> None:
    """The config's layer count must be the checkpoint's: compared on tensor names before any
    shape table is built from it."""
    found = layer_count(source, prefix)
    if found != layers:
        raise CheckpointError(f"{origin}: config.json says {layers} layers but the checkpoint holds {found} ({prefix}N.*)")


def renamed(canonical: Iterable[str], rules: Sequence[tuple[str, str, Stored]]) -> dict[str, tuple[str, Stored]]:
    """canonical name -> (checkpoint name, how it is stored), by the first rule whose regex
    matches the whole canonical name: `(pattern, replacement, stored)`, `re.sub` replacement syntax."""
    compiled = [(re.compile(p), repl, stored) for p, repl, stored in rules]
    out = {}
    for name in canonical:
        for pattern, repl, stored in compiled:
            if pattern.fullmatch(name):
                out[name] = (pattern.sub(repl, name), stored)
                break
        else:
            raise KeyError(f"no checkpoint name rule for {name}")  # a bug in the rules, not user input
    return out


def storage_view(source: TensorSource, canonical: Mapping[str, tuple[int, ...]], storage: Mapping[str, tuple[str, Stored]],
                what: str, optional: Mapping[str, tuple[int, ...]] | None = None,
                skipped: Mapping[str, tuple[str, int]] | None = None) -> MappedSource:  # fmt: skip
    """The canonical-name view of a checkpoint (fp32), after one strict check of every name and shape.
    `storage`: canonical name -> (checkpoint name, how it is stored there); two canonical names may
    read one tensor (a tied head, rows of a stack). `optional`: checkpoint tensors that may be
    present, with these shapes, and are not read; `skipped`: groups left out by prefix, for the
    manifest ({prefix: (what, count)})."""
    optional = dict(optional or {})
    expected = {theirs: stored.expected(canonical[ours], source.shape(theirs) if theirs in source else None)
                for ours, (theirs, stored) in storage.items()}  # fmt: skip
    check_strict(source, expected | optional, frozenset(optional), what=what)
    return MappedSource(source, {ours: (theirs, stored.read) for ours, (theirs, stored) in storage.items()}, canonical, skipped)


def checked_view(source: TensorSource, canonical: Mapping[str, tuple[int, ...]], renamed: Mapping[str, str],
                 conv_suffix: str | None, what: str, optional: Mapping[str, tuple[int, ...]] | None = None,
                 skipped: Mapping[str, tuple[str, int]] | None = None) -> MappedSource:  # fmt: skip
    """`storage_view` of the common storage: every tensor as is, under its canonical name unless
    `renamed` (canonical -> checkpoint name, e.g. a tied head: the embedding), except depthwise
    convs (names ending in `conv_suffix`, if given), read [C, 1, K] and squeezed to [C, K]."""
    storage = {n: (renamed.get(n, n), DEPTHWISE_CONV if conv_suffix and n.endswith(conv_suffix) else AS_IS) for n in canonical}
    return storage_view(source, canonical, storage, what, optional, skipped)


def load_mamba_folder(cj: Mapping[str, Any], source: TensorSource, family: str, readers, shapes, tied_by_default: bool):
    """(config, canonical view) of a Mamba-style folder (Mamba-1 and Mamba-2 share the layouts):
    transformers' (a model_type, `backbone.embeddings`, safetensors) or mamba_ssm's (d_model /
    n_layer / ssm_cfg, `backbone.embedding`, the head stored, .bin); every other tensor is
    `backbone.` + its canonical name. `readers`: the family's config module, with is_mamba_ssm,
    from_mamba_ssm(cj, origin, vocab_rows) and from_transformers(cj, origin)."""
    # mamba_ssm and older conversions name the table "embedding"; transformers "embeddings".
    embedding = next((n for n in ("backbone.embeddings.weight", "backbone.embedding.weight") if n in source),
                     "backbone.embeddings.weight")  # fmt: skip
    flags = ConfigReader(cj, source.origin, family)
    if readers.is_mamba_ssm(cj):
        if embedding not in source:
            raise CheckpointError(f"{source.origin}: not a mamba_ssm {family} checkpoint (no {embedding})")
        cfg = readers.from_mamba_ssm(cj, source.origin, source.shape(embedding)[0])
        tied, form = flags.bool("tie_embeddings", True), "mamba_ssm layout"
    else:
        cfg = readers.from_transformers(cj, source.origin)
        tied, form = flags.bool("tie_word_embeddings", tied_by_default), "transformers layout"
    cfg.validate()
    check_layer_count(cfg.num_layers, source, "backbone.layers.", source.origin)
    names = {n: f"backbone.{n}" for n in shapes(cfg)}
    names |= {"embeddings.weight": embedding, "lm_head.weight": head_name(tied, source, "lm_head.weight", embedding)}
    return cfg, checked_view(source, shapes(cfg), names, "conv1d.weight", f"{family} {cfg.describe()} ({form})")
