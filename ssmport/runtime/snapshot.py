"""State snapshots: every state of a runner plus the exact tokens that produced them.

A recurrent model's whole context is its state: a few MB, whatever the history length, so
"rewinding" a conversation is a copy instead of a re-prefill. Snapshots save to disk as
safetensors (the states and the token list) with a JSON header in its metadata.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ssmport.errors import SsmportError
from ssmport.files import write_output
from ssmport.manifest import Manifest, StateEntry, with_positions
from ssmport.state import KV

SNAPSHOT_FORMAT = "ssmport-state"
SNAPSHOT_VERSION = 1
_STATE_PREFIX = "state."
_TOKENS_KEY = "tokens"


def held_shape(entry: StateEntry, tokens: int) -> tuple[str, tuple[int, ...], str]:
    """(name, shape, dtype) a snapshot holds of a state after `tokens` tokens: a kv state's
    first `tokens` positions, a fixed state or a ring whole (a growing ring's W slots)."""
    if entry.kind != KV:
        return entry.name, entry.full_shape, entry.dtype
    return entry.name, with_positions(entry.shape, tokens), entry.dtype


@dataclass(frozen=True)
class StateSnapshot:
    """Every state of a runner (copied) and the exact tokens that produced them. A kv state
    keeps only its rows up to the token count (the rest is never read), so a snapshot of a
    hybrid is O(fixed states + the tokens so far), not O(context)."""

    bundle_id: str
    architecture: str
    states: dict[str, np.ndarray]  # in the bundle's state order
    tokens: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.states.values()) + 4 * len(self.tokens)

    def check_fits(self, manifest: Manifest) -> None:
        """Refuse a snapshot taken from another bundle, or whose states do not have the
        bundle's names, shapes and dtypes."""
        if self.bundle_id != manifest.bundle_id:
            raise SsmportError(
                f"this state snapshot was taken from another bundle (id {self.bundle_id[:12]}, "
                f"{self.architecture}); this bundle is {manifest.name} (id {manifest.bundle_id[:12]})"
            )
        want = [held_shape(s, len(self.tokens)) for s in manifest.states]
        got = [(n, a.shape, str(a.dtype)) for n, a in self.states.items()]
        if got != want:
            raise SsmportError(f"state snapshot holds states {got}; the bundle's are {want}")
        bad = [t for t in self.tokens if not 0 <= t < manifest.vocab_size]
        if bad:
            raise SsmportError(f"state snapshot holds token id {bad[0]}, outside the bundle's vocabulary "
                               f"[0, {manifest.vocab_size})")  # fmt: skip
        for name, value in self.states.items():
            if value.dtype.kind == "f" and not np.isfinite(value).all():  # a chat from it would print noise
                raise SsmportError(f"state snapshot's state {name} holds NaN or infinite values")

    def save(self, path: str | Path) -> Path:
        """Write as safetensors (states + the token list as int32) with a JSON header in its
        metadata; atomically, so a reader never sees half a file."""
        from safetensors.numpy import save

        path = Path(path)
        tensors = {_STATE_PREFIX + n: np.ascontiguousarray(a) for n, a in self.states.items()}
        tensors[_TOKENS_KEY] = np.asarray(self.tokens, dtype=np.int32)
        header = {"format": SNAPSHOT_FORMAT, "version": SNAPSHOT_VERSION, "bundle_id": self.bundle_id,
                  "architecture": self.architecture, "token_count": len(self.tokens),
                  "state_order": list(self.states)}  # fmt: skip
        data = save(tensors, metadata={"ssmport": json.dumps(header)})
        write_output(path, lambda f: f.write(data), what="state snapshot")
        return path

    @classmethod
    def load(cls, path: str | Path) -> StateSnapshot:
        from safetensors import SafetensorError
        from safetensors.numpy import load

        path = Path(path)
        try:
            if path.exists() and not path.is_dir() and not path.is_file():  # /dev/zero would be read forever
                raise SsmportError(f"{path}: not a regular file (a state snapshot is a .safetensors file)")
            data = path.read_bytes()
        except OSError as exc:
            raise SsmportError(f"{path}: cannot read ({exc.strerror})") from None
        try:
            tensors = load(data)
            header = json.loads(_safetensors_metadata(data)["ssmport"])
            if not isinstance(header, dict) or header.get("format") != SNAPSHOT_FORMAT:
                raise ValueError("not an ssmport state snapshot")
            if header.get("version") != SNAPSHOT_VERSION:
                raise ValueError(f"it is format version {header.get('version')!r}; this ssmport reads version "
                                 f"{SNAPSHOT_VERSION} only")  # fmt: skip
            states = {n: tensors[_STATE_PREFIX + n] for n in header["state_order"]}
            tokens = tuple(int(t) for t in tensors[_TOKENS_KEY])
            if len(tokens) != header["token_count"]:
                raise ValueError("token count does not match its header")
            return cls(header["bundle_id"], header["architecture"], states, tokens)
        except (SafetensorError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SsmportError(f"{path}: not a valid ssmport state snapshot ({exc})") from None


def _safetensors_metadata(data: bytes) -> dict:
    """The `__metadata__` of a safetensors blob (8-byte little-endian length, JSON header)."""
    if len(data) < 8:
        raise ValueError("file too short")
    n = int.from_bytes(data[:8], "little")
    meta = json.loads(data[8 : 8 + n]).get("__metadata__")
    if not isinstance(meta, dict) or "ssmport" not in meta:
        raise ValueError("no ssmport header")
    return meta
