"""The no-KV decode runner on `coreai.runtime`.

- Lowers the bundle's asset once and caches the lowered model (keyed by the asset's content
  hash and the coreai-core version; stale or corrupt entries are detected and rebuilt), so
  later loads take milliseconds instead of seconds.
- Binds states by name, allocated zero-filled from the function descriptor with the dtype
  the graph declares, and checks them against the manifest.
- Keeps the exact list of tokens fed since the last reset.
- Feeds prompts through the bundle's `prefill` function, T tokens per call, when it has
  one (see ssmport/prefill.py), and decodes through `main`.
"""

from __future__ import annotations

import atexit
import gc
import weakref
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ssmport._quiet import native_stderr_filtered
from ssmport.bundle import Bundle, write_json_atomic
from ssmport.coreai_loop import CoreAILoop, settle
from ssmport.errors import BundleError, SsmportError
from ssmport.interrupts import interrupts_held
from ssmport.sampling import sample_next
from ssmport.session import StateSnapshot


def cache_root() -> Path:
    env = os.environ.get("SSMPORT_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ssmport"


def _coreai_version() -> str:
    from importlib.metadata import version

    return version("coreai-core")


# --------------------------------------------------------------------------------------
# The lowering cache: $SSMPORT_CACHE/lowered/<key>.aimodelx, key = sha256 of the asset's
# bytes + the coreai-core version. A stamp written last inside each entry records its key and
# the size and mtime of every file it holds; an entry whose stamp is missing, unreadable or
# for another key, or whose files differ from the stamp (missing, truncated, rewritten), is
# stale or corrupt and is rebuilt. File stats, not a re-hash, so a cached load stays in
# milliseconds; it matters: the runtime dies (SIGILL) loading damaged lowered bytes.
# --------------------------------------------------------------------------------------

STAMP = "ssmport-lowered.json"
_HASH_CHUNK = 8 << 20


def _file_list(root: Path) -> list[tuple[str, int, int]]:
    """(relative path, size, mtime_ns) of every file under `root`, sorted."""
    return sorted(
        (p.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file() and (st := p.stat())
    )


def asset_sha256(asset: Path) -> str:
    """sha256 over the asset's files (names and bytes), remembered per path and file stats,
    so an unchanged asset is hashed once (hashing 0.1B takes ~1.5 s, 1.5B ~12 s)."""
    asset = asset.resolve()
    files = _file_list(asset)
    memo = _hash_memo(asset)
    try:
        saved = json.loads(memo.read_text())
        if saved["files"] == [list(f) for f in files]:
            return saved["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no memo, or an unreadable one: hash again
    digest = hashlib.sha256()
    for rel, _, _ in files:
        digest.update(rel.encode() + b"\0")
        with open(asset / rel, "rb") as f:
            while chunk := f.read(_HASH_CHUNK):
                digest.update(chunk)
    value = digest.hexdigest()
    memo.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(memo, {"asset": str(asset), "files": files, "sha256": value})
    return value


def lowering_key(bundle: Bundle) -> str:
    return hashlib.sha256(f"{asset_sha256(bundle.asset_path)}:{_coreai_version()}".encode()).hexdigest()[:32]


def _hash_memo(asset: Path) -> Path:
    return cache_root() / "asset-hashes" / (hashlib.sha256(str(asset.resolve()).encode()).hexdigest()[:24] + ".json")


def forget_lowering(bundle: Bundle) -> None:
    """Drop the bundle's cache entry and remembered asset hash (the next load is a first load)."""
    shutil.rmtree(lowered_path(bundle), ignore_errors=True)
    _hash_memo(bundle.asset_path).unlink(missing_ok=True)


def lowered_path(bundle: Bundle) -> Path:
    return cache_root() / "lowered" / f"{lowering_key(bundle)}.aimodelx"


def cached_lowering_ok(target: Path, key: str) -> bool:
    """Whether `target` is a complete lowering for `key` (stamp present, files as stamped)."""
    try:
        stamp = json.loads((target / STAMP).read_text())
        if stamp["key"] != key:
            return False
        files = {rel: [size, mtime] for rel, size, mtime in _file_list(target) if rel != STAMP}
        return bool(files) and files == stamp["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def uses_os_runtime() -> bool:
    """macOS with the OS Core AI framework: it loads `.aimodel` assets itself (and caches
    their specialization), the way `AIModelAsset.executable()` decides. Not testable on this
    Linux machine."""
    import coreai.runtime

    return sys.platform == "darwin" and bool(getattr(coreai.runtime, "_use_os_coreai", False))


def ensure_lowered(bundle: Bundle, rebuild: bool = False) -> tuple[Path, bool]:
    """Return (loadable model dir, whether it was lowered now). Lowering is atomic; a stale
    or corrupt cache entry (or any entry, with `rebuild`) is replaced."""
    if uses_os_runtime():
        return bundle.asset_path, False
    key = lowering_key(bundle)
    target = cache_root() / "lowered" / f"{key}.aimodelx"
    if not rebuild and cached_lowering_ok(target, key):
        return target, False
    from coreai.authoring import AIModelAsset

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".lowering-", suffix=".aimodelx", dir=target.parent))
    try:
        try:
            asset = AIModelAsset.load(bundle.asset_path)
        except RuntimeError as exc:
            raise BundleError(f"{bundle.asset_path}: not a loadable Core AI asset ({exc})") from None
        # Private in coreai-core 1.0.0b3 (what `asset.executable()` does on every entry);
        # wrapped here only, and the cache key carries the coreai-core version.
        asset._write_odix(tmp)
        del asset
        files = {rel: [size, mtime] for rel, size, mtime in _file_list(tmp)}
        write_json_atomic(tmp / STAMP, {"key": key, "asset": str(bundle.asset_path.resolve()),
                                        "coreai_core": _coreai_version(), "files": files})  # fmt: skip
        _replace_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target, True


def _replace_dir(new: Path, target: Path) -> None:
    """Move `new` to `target`; an existing (stale, corrupt, or raced) entry is moved aside
    first and then deleted, so readers never see a half-removed directory."""
    if target.exists():
        trash = Path(tempfile.mkdtemp(prefix=".stale-", dir=target.parent))
        try:
            os.replace(target, trash / target.name)
        except OSError:
            pass  # another process replaced it first; ours replaces theirs below
        shutil.rmtree(trash, ignore_errors=True)
    try:
        os.replace(new, target)
    except OSError:  # a racing process put a fresh entry in place meanwhile: keep theirs
        shutil.rmtree(new, ignore_errors=True)


# Runners still open at exit are closed (and the runtime settled, see ssmport.coreai_loop)
# before the interpreter starts finalizing.
_LIVE: weakref.WeakSet[Runner] = weakref.WeakSet()


@atexit.register
def _close_live_runners() -> None:
    for runner in list(_LIVE):
        runner.close()


class Runner:
    """Run an exported bundle: prompts through `prefill` (when the bundle has it), then
    one token at a time through the decode function `main`.

    `prefill=False` forces the M=1 path for prompts too (tests and benchmarks compare both).
    """

    def __init__(self, bundle: Bundle | str | Path, function: str = "main", prefill: bool = True):
        from coreai.runtime import AIModel

        self.bundle = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle)
        m = self.bundle.manifest
        self.vocab_size = int(m["outputs"][0]["shape"][-1])
        self._loop = CoreAILoop()
        _LIVE.add(self)
        lowered, self.lowered_now = ensure_lowered(self.bundle)
        prefill_entry = m.get("prefill") if prefill else None  # absent in bundles made before prefill
        with native_stderr_filtered(), interrupts_held():
            try:
                self._model = self._loop.run_until_complete(AIModel.load(lowered))
            except Exception:
                if self.lowered_now:
                    raise
                # A cached lowering that passed its stamp check but does not load (bytes
                # damaged in place): lower again, once.
                lowered, self.lowered_now = ensure_lowered(self.bundle, rebuild=True)
                self._model = self._loop.run_until_complete(AIModel.load(lowered))
            self._fn = self._model.load_function(function)
            self._prefill = self._model.load_function(prefill_entry["function"]) if prefill_entry else None
        self.prefill_chunk: int | None = int(prefill_entry["chunk"]) if prefill_entry else None
        self._check_descriptor(self._fn, function, m)
        if prefill_entry:
            self._check_descriptor(self._prefill, prefill_entry["function"], prefill_entry | {"states": m["states"]})
        self.tokens: list[int] = []
        self._states: dict[str, np.ndarray] = {}
        self.reset()

    @property
    def has_prefill(self) -> bool:
        """Whether prompts go through the bundle's chunked `prefill` function."""
        return self._prefill is not None

    def _check_descriptor(self, fn, name: str, entry: dict) -> None:
        """The function's interface as the runtime reports it must be the manifest's."""
        d = fn.desc
        expect = {
            "inputs": [(s["name"], s["shape"], s["dtype"]) for s in entry["inputs"]],
            "outputs": [(s["name"], s["shape"], s["dtype"]) for s in entry["outputs"]],
            "states": [(s["name"], s["shape"], s["dtype"]) for s in entry["states"]],
        }
        got = {
            "inputs": [(n, list(d.input_descriptor(n).shape), d.input_descriptor(n).dtype) for n in d.input_names],
            "outputs": [(n, list(d.output_descriptor(n).shape), d.output_descriptor(n).dtype) for n in d.output_names],
            "states": [(n, list(d.state_descriptor(n).shape), d.state_descriptor(n).dtype) for n in d.state_names],
        }
        for kind in expect:
            if expect[kind] != got[kind]:
                raise BundleError(
                    f"{self.bundle.path}: the asset's @{name} {kind} "
                    f"{got[kind]} do not match the manifest {expect[kind]}"
                )

    @property
    def state_names(self) -> list[str]:
        return list(self._fn.desc.state_names)

    def reset(self) -> None:
        """Zero every state (the Linux runtime does not zero buffers for us)."""
        from coreai.runtime import NDArray

        d = self._fn.desc
        self._states = {}
        for name in d.state_names:
            desc = d.state_descriptor(name)
            self._states[name] = np.zeros(desc.shape, dtype=np.dtype(desc.dtype))
        # NDArray copies the array: the runtime updates its own buffers (read them via state()).
        self._bound = {name: NDArray(arr) for name, arr in self._states.items()}
        self.tokens = []

    def state(self, name: str) -> np.ndarray:
        """The current value of a state (a copy)."""
        return self._bound[name].numpy().copy()

    def snapshot(self) -> StateSnapshot:
        """A copy of every state and of the tokens fed: O(state size), whatever the history."""
        m = self.bundle.manifest
        states = {name: self._bound[name].numpy().copy() for name in self.state_names}
        return StateSnapshot(m["bundle_id"], m["architecture"], states, tuple(self.tokens))

    def restore(self, snap: StateSnapshot) -> None:
        """Put the states and token list back as they were when `snap` was taken."""
        from coreai.runtime import NDArray

        snap.check_fits(self.bundle.manifest)
        # NDArray copies the array it is given (and `.numpy()` returns a copy): bind new ones.
        self._bound = {name: NDArray(np.ascontiguousarray(snap.states[name])) for name in self.state_names}
        self.tokens = list(snap.tokens)

    def _check_ids(self, tokens: list[int]) -> None:
        bad = [t for t in tokens if not 0 <= int(t) < self.vocab_size]
        if bad:
            raise SsmportError(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")

    def step(self, token: int) -> np.ndarray:
        """Feed one token through `main`; return the logits after it as float32 [V]."""
        from coreai.runtime import NDArray

        self._check_ids([token])
        inputs = {
            "input_ids": NDArray(np.array([[token]], dtype=np.int32)),
            "position_ids": NDArray(np.array([[len(self.tokens)]], dtype=np.int32)),
        }
        with interrupts_held():  # a call is never abandoned half-way (see ssmport.coreai_loop)
            out = self._loop.run_until_complete(self._fn(inputs=inputs, state=self._bound))
            self.tokens.append(int(token))
        return np.asarray(out["logits"].numpy(), dtype=np.float32).reshape(-1).copy()

    def step_each(self, tokens: list[int]) -> np.ndarray:
        """Feed tokens one by one through `main`; return the logits after each, float32 [T, V]."""
        rows = [self.step(t) for t in tokens]
        return np.stack(rows) if rows else np.zeros((0, self.vocab_size), np.float32)

    def feed(self, tokens: list[int]) -> np.ndarray:
        """Feed a prompt; return the logits after its last token, float32 [V].

        Through `prefill`, `prefill_chunk` tokens per call (the last chunk padded), when the
        bundle has it and it was not turned off; otherwise one token at a time.
        """
        if not tokens:
            raise SsmportError("feed needs at least one token")
        self._check_ids(tokens)
        if not self.has_prefill:
            return self.step_each(tokens)[-1]
        T = self.prefill_chunk
        for start in range(0, len(tokens), T):
            logits = self._prefill_call([int(t) for t in tokens[start : start + T]])
        return logits

    def _prefill_call(self, chunk: list[int]) -> np.ndarray:
        from coreai.runtime import NDArray

        T, n = self.prefill_chunk, len(chunk)
        ids = np.zeros((1, T), dtype=np.int32)  # padding past valid_len never reaches a state
        ids[0, :n] = chunk
        first = len(self.tokens)
        inputs = {
            "input_ids": NDArray(ids),
            "position_ids": NDArray(np.arange(first, first + T, dtype=np.int32).reshape(1, T)),
            "valid_len": NDArray(np.array([n], dtype=np.int32)),
        }
        with interrupts_held():  # a call is never abandoned half-way (see ssmport.coreai_loop)
            out = self._loop.run_until_complete(self._prefill(inputs=inputs, state=self._bound))
            self.tokens.extend(chunk)
        return np.asarray(out["logits"].numpy(), dtype=np.float32).reshape(-1).copy()

    def generate(
        self,
        prompt: list[int],
        max_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        stop: set[int] | None = None,
    ) -> Iterator[int]:
        """Feed the prompt, then yield up to `max_tokens` new ids (greedy at temperature 0)."""
        if not prompt:
            raise SsmportError("generation needs at least one prompt token")
        rng = np.random.default_rng(seed)
        logits = self.feed(prompt)
        for _ in range(max_tokens):
            token = sample_next(logits, temperature, top_p, rng)
            yield token
            if stop and token in stop:
                return
            logits = self.step(token)

    def close(self) -> None:
        """Release the runtime objects now, in a fixed order, not at interpreter exit."""
        for attr in ("_bound", "_prefill", "_fn", "_model"):
            if hasattr(self, attr):
                delattr(self, attr)
        gc.collect()
        settle()  # the runtime's threads let go of their Python objects before we go on
        if not self._loop.is_closed():
            self._loop.close()
        _LIVE.discard(self)

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
