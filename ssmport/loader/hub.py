"""Checkpoints from the Hugging Face Hub: a preset's source or `org/repo[@revision]` -> local files.

huggingface_hub does the transfer: its cache (HF_HOME, HF_HUB_CACHE), HF_HUB_OFFLINE, HF_TOKEN,
ranged retries of a dropped connection, and a temp file renamed into the cache only when
complete. This module decides which files an export needs (never a repo's other formats or
quantizations), checks the disk before anything large comes, verifies every file against
the hash the Hub reports, and turns the client's exceptions into one-line SsmportErrors.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import io
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ssmport.loader.checkpoint import HF_WEIGHT_FILES, shard_names
from ssmport.errors import SsmportError
from ssmport.interrupts import stops_at_once
from ssmport.tokenizers import HF_TOKENIZER_FILENAME, VOCAB_FILENAMES
from ssmport.tokenizers.chat_template import CONFIG_FILE as TOKENIZER_CONFIG_FILE
from ssmport.tokenizers.chat_template import TEMPLATE_FILE as CHAT_TEMPLATE_FILE

# The Hub's repo ids: "namespace/name", letters, digits, "-", "_", ".".
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# The tokenizer files `tokenizers.find_tokenizer` looks for next to a checkpoint.
_TOKENIZER_NAMES = "|".join(map(re.escape, (*VOCAB_FILENAMES, HF_TOKENIZER_FILENAME)))
_TOKENIZER_FILES = re.compile(rf"({_TOKENIZER_NAMES}|rwkv_vocab_[^/]*\.txt)")
_SINGLE_FILE_SUFFIXES = (".pth", ".pt")
_HEX = re.compile(r"[0-9a-f]+")
_OFFLINE_MODE = "HF_HUB_OFFLINE is set"


class DownloadDisplay(Protocol):
    """Where download progress goes (`ssmport.progress.Stages`): a bar of `total` bytes."""

    def download(self, name: str, total: int) -> contextlib.AbstractContextManager[Callable[[int], None]]: ...


@dataclass
class HubCheckpoint:
    """What `fetch` leaves on disk, and where it came from."""

    path: Path  # the snapshot folder (a model folder) or the single-file checkpoint in it
    provenance: dict[str, Any]  # repo, revision asked for, commit, every file with size and sha256
    notes: list[str] = field(default_factory=list)


def is_repo_id(text: str) -> bool:
    return bool(_REPO_ID.fullmatch(text))


def split_revision(spec: str) -> tuple[str, str | None]:
    """"org/repo@rev" -> ("org/repo", "rev"); the revision is a branch, tag or commit sha."""
    name, at, revision = spec.partition("@")
    if at and not revision:
        raise SsmportError(f"{spec!r}: nothing after '@' (give a branch, tag or commit sha)")
    return name, revision or None


@dataclass(frozen=True)
class _File:
    size: int | None
    digest: tuple[str, str] | None  # ("sha256", hex) for LFS files, ("git-sha1", hex) otherwise


@dataclass
class _Listing:
    """A repo at one revision: from the Hub, or (offline, Hub unreachable) from the cache."""

    repo: str
    revision: str | None  # what the user asked for
    resolved: Any  # huggingface_hub's ResolvedRevision: the revision and the commit it points to
    files: dict[str, _File]
    offline_reason: str | None = None  # why the cache is used instead of the Hub

    @property
    def offline(self) -> bool:
        return self.offline_reason is not None

    @property
    def commit(self) -> str:
        return self.resolved.resolved


def fetch(
    repo: str,
    revision: str | None = None,
    file: str | None = None,
    *,
    check_config: Callable[[Path, str], Any] | None = None,
    display: DownloadDisplay | None = None,
) -> HubCheckpoint:
    """Download (or find in the cache) what an export of `repo` needs.

    `file`: a single-file checkpoint (.pth) in the repo; otherwise the repo must be a model
    folder (config.json and weights), or hold exactly one .pth. `check_config(config_path,
    where)` raises when no architecture claims a folder's config.json; it runs before any
    weights are downloaded.
    """
    what = f"{repo}@{revision}" if revision else repo
    _install_timeouts()
    with _client_errors(what, revision), _client_warnings_muted():
        # Nothing is written while the repo is listed: a stop signal ends a read blocked on a
        # silent server at once (it never reached a safe point). Not the downloads below: they
        # run in the client's worker threads, which would finish a file the main thread left.
        with stops_at_once():
            listing = _list_files(repo, revision)
        got = _Fetcher(listing, display)
        if file is not None:
            if not file.endswith(_SINGLE_FILE_SUFFIXES):
                raise SsmportError(f"--file {file}: pick a .pth checkpoint; a model folder is exported whole")
            if file not in listing.files:
                raise SsmportError(f"{what} has no file {file!r}{_some('.pth', listing)}")
            names = [file, *_tokenizer_files(listing)]
        elif "config.json" in listing.files:
            index, single = _weight_layout(listing)
            small = ["config.json", *([index] if index else []), *_tokenizer_files(listing)]
            root = got.download(small)
            if check_config is not None:
                check_config(root / "config.json", what)
            names = small + (_shards(listing, root / index) if index else [single])
        else:
            file = _only_checkpoint(listing, what)
            names = [file, *_tokenizer_files(listing)]
        root = got.download(names)
    notes = []
    if listing.offline and listing.offline_reason != _OFFLINE_MODE:
        notes.append(f"{what}: the Hub could not be reached ({listing.offline_reason}); used the cached copy")
    return HubCheckpoint(
        path=root / file if file else root,
        provenance={"repo": repo, "revision": revision, "commit": listing.commit, "file": file, "files": got.verified},
        notes=notes,
    )


def _list_files(repo: str, revision: str | None) -> _Listing:
    """Pin the revision to a commit (cached in the Hub cache's refs/), then list its files with
    their sizes and hashes: from the Hub, or from the cache when the Hub cannot be used."""
    from huggingface_hub import HfApi, constants, get_cached_repo_tree, get_token
    from huggingface_hub.errors import CachedRepoTreeNotFoundError, HfHubHTTPError, RevisionResolutionError

    api, offline = HfApi(), constants.is_offline_mode()
    reason = _OFFLINE_MODE
    try:
        resolved = api.resolve_revision(repo, revision=revision, local_files_only=offline)
    except RevisionResolutionError as exc:
        raise _not_cached(repo, revision, reason if offline else _one_line(exc.__cause__ or exc)) from None
    if not offline:
        try:
            info = api.model_info(repo, revision=resolved.resolved, files_metadata=True)
        except _unreachable() as exc:
            reason = _one_line(exc)
        except HfHubHTTPError as exc:
            if exc.response is None or exc.response.status_code < 500:
                raise
            reason = f"HTTP {exc.response.status_code}"
        else:
            if info.gated and get_token() is None:
                raise SsmportError(_gated(repo))
            files = {s.rfilename: _File(s.lfs.size if s.lfs else s.size, _listed_digest(s)) for s in info.siblings or ()}
            return _Listing(repo, revision, resolved, files)
    try:
        tree = get_cached_repo_tree(repo, revision=resolved)
    except CachedRepoTreeNotFoundError:
        raise _not_cached(repo, revision, reason) from None
    return _Listing(repo, revision, resolved, {f.path: _File(f.size, None) for f in tree}, offline_reason=reason)


def _not_cached(repo: str, revision: str | None, reason: str) -> SsmportError:
    from huggingface_hub import constants

    return SsmportError(
        f"{repo}{'@' + revision if revision else ''}: not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and "
        f"the Hub cannot be used ({reason}); run once with network access, or pass a local checkpoint"
    )


def _listed_digest(sibling) -> tuple[str, str] | None:
    if sibling.lfs is not None:
        return ("sha256", sibling.lfs.sha256)
    return ("git-sha1", sibling.blob_id) if sibling.blob_id else None


class _Fetcher:
    """Downloads a listing's files into the Hub cache, each checked before it is used."""

    def __init__(self, listing: _Listing, display: DownloadDisplay | None):
        self.listing, self.display = listing, display
        self.verified: list[dict[str, Any]] = []
        self._done: set[str] = set()

    def download(self, names: list[str]) -> Path:
        from huggingface_hub import snapshot_download

        listing = self.listing
        missing = self._missing(names)
        total = sum(listing.files[n].size or 0 for n in missing)
        if missing:
            _check_disk_space(listing.repo, total, len(missing))
        with self._progress(total) as advance:
            try:
                root = Path(
                    snapshot_download(
                        listing.repo,
                        revision=listing.resolved,  # pinned: every call gets the same commit's files
                        allow_patterns=[glob.escape(n) for n in names],
                        local_files_only=listing.offline,
                        tqdm_class=_bar_class(advance),
                    )
                )
            except ValueError as exc:  # the client's own limits (e.g. > 50 GB without hf_xet)
                raise SsmportError(f"{listing.repo}: {_one_line(exc)}") from None
        for name in names:
            if name not in self._done:
                self.verified.append(_verify(root, name, listing.files[name], listing.repo))
                self._done.add(name)
        return root

    def _missing(self, names: list[str]) -> list[str]:
        from huggingface_hub import try_to_load_from_cache

        if self.listing.offline:  # nothing will be downloaded
            return []
        repo, commit = self.listing.repo, self.listing.commit
        return [n for n in names if not isinstance(try_to_load_from_cache(repo, n, revision=commit), str)]

    @contextlib.contextmanager
    def _progress(self, total: int) -> Iterator[Callable[[int], None]]:
        if self.display is None or total == 0:
            yield lambda n: None
            return
        with self.display.download(f"Downloading {self.listing.repo}", total) as advance:
            yield advance


def _bar_class(advance: Callable[[int], None]) -> type:
    """A tqdm class for snapshot_download that prints nothing and feeds one of its byte bars
    (the first: bytes received) to `advance`; the others (files done, bytes written) are
    counted by tqdm and dropped."""
    from tqdm.std import tqdm

    claimed: list[tqdm] = []

    class _Bar(tqdm):
        monitor_interval = 0  # no monitor thread

        def __init__(self, *args, **kwargs):
            kwargs.update(file=io.StringIO(), leave=False, disable=False)
            super().__init__(*args, **kwargs)
            self._feeds = kwargs.get("unit") == "B" and not claimed
            if self._feeds:
                claimed.append(self)

        def update(self, n=1):
            if self._feeds and n:
                advance(int(n))
            return super().update(n)

    return _Bar


def _check_disk_space(repo: str, need: int, count: int) -> None:
    """Refuse before downloading what the cache's disk cannot hold (sizes as the Hub reports them)."""
    from huggingface_hub import constants

    where = Path(constants.HF_HUB_CACHE).expanduser()
    probe = next((p for p in (where, *where.parents) if p.exists()), Path("/"))
    if not where.exists() or where.is_dir():  # (a file there is the client's error, one line below)
        try:  # what the client will do, tried first: its own failure here was a dozen lines
            where.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=where).close()
        except OSError as exc:
            raise SsmportError(f"{repo}: the Hub cache {where} cannot be written ({exc.strerror or exc}); "
                               "point HF_HUB_CACHE at a writable folder") from None  # fmt: skip
    free = shutil.disk_usage(probe).free
    if need > free:
        raise SsmportError(
            f"{repo}: the download needs {_gb(need)} ({count} file{'s' * (count > 1)}) but {probe} has "
            f"{_gb(free)} free; free some space or point HF_HUB_CACHE at a larger disk"
        )


def _verify(root: Path, name: str, remote: _File, repo: str) -> dict[str, Any]:
    """Hash a downloaded file against the Hub's report (or, offline, its blob's name, which is
    the ETag the Hub sent with it). A mismatch removes the blob and its link from the cache."""
    path = root / name
    blob = path.resolve()
    expected = remote.digest or _digest_from_blob_name(blob.name)
    size = path.stat().st_size
    sha256 = hashlib.sha256()
    git = hashlib.sha1(f"blob {size}\0".encode()) if expected and expected[0] == "git-sha1" else None
    with open(path, "rb") as f:
        while chunk := f.read(1 << 23):
            sha256.update(chunk)
            if git is not None:
                git.update(chunk)
    got = {"sha256": sha256.hexdigest(), "git-sha1": git.hexdigest() if git else None}
    if expected and got[expected[0]] != expected[1]:
        blob.unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        raise SsmportError(
            f"{repo}: {name}: {expected[0]} {got[expected[0]]} does not match the Hub's {expected[1]}; "
            "the file was removed from the cache (run the command again to download it afresh)"
        )
    return {"name": name, "size": size, "sha256": got["sha256"]}


def _digest_from_blob_name(name: str) -> tuple[str, str] | None:
    if _HEX.fullmatch(name):
        return {64: ("sha256", name), 40: ("git-sha1", name)}.get(len(name))
    return None


def _tokenizer_files(listing: _Listing) -> list[str]:
    """The tokenizer next to the weights; with a tokenizer.json, the files that say how it is
    used (special tokens, the chat template: `ssmport chat`)."""
    names = [n for n in listing.files if _TOKENIZER_FILES.fullmatch(n)]
    if HF_TOKENIZER_FILENAME in names:
        names += [n for n in (TOKENIZER_CONFIG_FILE, CHAT_TEMPLATE_FILE) if n in listing.files]
    return sorted(names)


def _weight_layout(listing: _Listing) -> tuple[str | None, str | None]:
    """(shard index, None) or (None, single file): what `checkpoint.open_hf_weights` will read,
    in its order of preference."""
    for index, single in HF_WEIGHT_FILES:
        if index in listing.files:
            return index, None
        if single in listing.files:
            return None, single
    raise SsmportError(
        f"{listing.repo}: config.json but no weights ssmport reads (model.safetensors[.index.json] or pytorch_model.bin)"
    )


def _shards(listing: _Listing, index: Path) -> list[str]:
    shards = shard_names(index)
    absent = [s for s in shards if s not in listing.files]
    if absent:
        raise SsmportError(f"{listing.repo}: {index.name} lists shard(s) the repo does not have: {', '.join(absent)}")
    return shards


def _only_checkpoint(listing: _Listing, what: str) -> str:
    candidates = sorted(n for n in listing.files if n.endswith(_SINGLE_FILE_SUFFIXES))
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise SsmportError(f"{what}: neither a model folder (config.json) nor a .pth checkpoint: nothing to export")
    raise SsmportError(f"{what} holds {len(candidates)} .pth checkpoints; pick one with --file{_some('.pth', listing)}")


def _some(suffix: str, listing: _Listing, limit: int = 3) -> str:
    names = sorted(n for n in listing.files if n.endswith(suffix))
    if not names:
        return ""
    more = f", ... ({len(names) - limit} more)" if len(names) > limit else ""
    return f" (e.g. {', '.join(names[-limit:])}{more})"


def _gated(repo: str) -> str:
    return (
        f"{repo} is gated: accept its terms on the Hub, then set HF_TOKEN (or run `hf auth login`) "
        "with a token of that account"
    )


def _install_timeouts() -> None:
    """Give the client's HTTP session timeouts: it has none, so a server that accepts the
    connection and never answers hung an export forever. HF_HUB_ETAG_TIMEOUT bounds the
    connection, HF_HUB_DOWNLOAD_TIMEOUT each wait for data (a download's total time is not
    bounded, only its silences); read when a fetch starts, so the variables always apply."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.utils import _http

    def seconds(name: str, default: float) -> float:
        try:
            value = float(os.environ.get(name, ""))
        except ValueError:
            return default
        return value if value > 0 else default

    timeout = httpx2.Timeout(seconds("HF_HUB_DOWNLOAD_TIMEOUT", constants.HF_HUB_DOWNLOAD_TIMEOUT),
                             connect=seconds("HF_HUB_ETAG_TIMEOUT", constants.HF_HUB_ETAG_TIMEOUT))  # fmt: skip

    def bounded(request) -> None:  # the client passes timeout=None on each request: set it here
        if not any((request.extensions.get("timeout") or {}).values()):
            request.extensions["timeout"] = timeout.as_dict()

    def client():
        made = _http.default_client_factory()
        made.event_hooks["request"] = [bounded, *made.event_hooks["request"]]
        return made

    _http.set_client_factory(client)


def _unreachable() -> tuple[type[BaseException], ...]:
    """The client's errors for 'no answer at all' (its HTTP stack is httpx2)."""
    import httpx2
    from huggingface_hub.errors import OfflineModeIsEnabled

    return (httpx2.ConnectError, httpx2.TimeoutException, OfflineModeIsEnabled)


@contextlib.contextmanager
def _client_errors(what: str, revision: str | None) -> Iterator[None]:
    """huggingface_hub's exceptions, each as one line that says what to do."""
    import httpx2
    from huggingface_hub import errors as hf

    try:
        yield
    except hf.GatedRepoError:
        raise SsmportError(_gated(what.partition("@")[0])) from None
    except hf.RevisionNotFoundError:
        raise SsmportError(f"{what}: the repo has no revision {revision!r} (a branch, tag or commit sha)") from None
    except hf.RepositoryNotFoundError:
        raise SsmportError(
            f"{what}: no such model repository on the Hub (nor a local path); a private repo needs HF_TOKEN"
        ) from None
    except hf.RemoteEntryNotFoundError as exc:
        raise SsmportError(f"{what}: the Hub has no such file ({_one_line(exc)})") from None
    except hf.LocalEntryNotFoundError as exc:  # offline, and the cache lacks a file
        message = f"{what}: the cached copy is incomplete and the Hub cannot be used ({_one_line(exc)})"
        raise SsmportError(message) from None
    except hf.HFValidationError as exc:  # 'h/..': the client's own rules for a repo id
        raise SsmportError(f"{what}: not a valid Hub repo id ({_one_line(exc)})") from None
    except json.JSONDecodeError:  # HTTP 200 with an HTML page: a captive portal, a proxy's login page
        from huggingface_hub import constants

        raise SsmportError(f"{what}: the Hub's answer is not JSON: is {constants.ENDPOINT} a Hugging Face Hub "
                           "(HF_ENDPOINT), or is a proxy or a network login page answering instead?") from None  # fmt: skip
    except hf.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        hint = "; check HF_TOKEN" if status in (401, 403) else ""
        raise SsmportError(f"{what}: the Hub answered HTTP {status} ({_one_line(exc)}){hint}") from None
    except (*_unreachable(), httpx2.HTTPError) as exc:
        raise SsmportError(
            f"{what}: download failed ({type(exc).__name__}: {_one_line(exc)}); the partial file was discarded, "
            "run the command again"
        ) from None
    except OSError as exc:  # the client's size check, a full disk, an unwritable cache
        raise SsmportError(f"{what}: download failed ({_one_line(exc)}); the partial file was discarded") from None


@contextlib.contextmanager
def _client_warnings_muted() -> Iterator[None]:
    """The client logs warnings (a cached commit used, a download resumed) as extra lines on
    stderr; what the user needs to hear is said by ssmport's own note or error line."""
    log = logging.getLogger("huggingface_hub")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
