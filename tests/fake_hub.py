"""A small Hugging Face Hub on 127.0.0.1 for the download tests.

It answers the requests the installed huggingface_hub client makes for `model_info`,
`snapshot_download` and `hf_hub_download`, the way the Hub does (read from the client's source,
huggingface_hub 2.4):

- GET  /api/models/{repo}[/revision/{rev}]?blobs=True -> {"id", "sha", "gated", "siblings":
  [{"rfilename", "size", "blobId", "lfs": {"sha256", "size", "pointerSize"}}]}
- GET  /api/models/{repo}/tree/{rev}?recursive=True -> [{"type": "file", "path", "size", "oid",
  "lfs": {"oid", "size", "pointerSize"}}]
- HEAD/GET /{repo}/resolve/{rev}/{path}: a small file directly (ETag = its git blob sha1); an LFS
  file (weights) as a 302 to a "CDN" on another host name (localhost), with X-Linked-Etag (its
  sha256) and X-Linked-Size; always X-Repo-Commit
- GET  /cdn/{sha256} on that host, honouring Range (206, for resumed downloads)
- errors with the Hub's X-Error-Code: RepoNotFound (401 without a token, as the Hub answers),
  RevisionNotFound (404), EntryNotFound (404), GatedRepo (401 without a token, 403 with a wrong one)

No xet headers are ever sent, so the client takes the plain HTTP path. Switches on the
server make it misbehave: drop a connection part-way through a file, report a wrong sha256,
report huge sizes. Every request is recorded (method, path, headers).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".pth", ".pt", ".bin", ".safetensors")


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class FakeRepo:
    commits: dict[str, dict[str, bytes]]  # commit sha -> {path: content}
    refs: dict[str, str]  # branch or tag -> commit sha
    gated: bool = False

    def resolve(self, revision: str | None) -> str | None:
        revision = revision or "main"
        return revision if revision in self.commits else self.refs.get(revision)


@dataclass
class Misbehaviour:
    drop_after: dict[str, int] = field(default_factory=dict)  # file name -> bytes sent before the cut
    drops_left: dict[str, int] = field(default_factory=dict)  # file name -> how many GETs are cut
    wrong_sha256: set[str] = field(default_factory=set)  # file names whose reported sha256 is wrong
    huge: set[str] = field(default_factory=set)  # file names reported as 10**15 bytes
    while_sending: dict[str, Callable[[], None]] = field(default_factory=dict)  # called half-way through a file
    status: int | None = None  # every request answered with this HTTP status (500, 429), Retry-After 0
    html: bool = False  # every request answered 200 with an HTML page (a captive portal, a proxy)
    silent: bool = False  # every connection accepted and read, never answered (until the hub stops)


class FakeHub:
    TOKEN = "hf_good_token"
    HUGE = 10**15

    def __init__(self):
        self.repos: dict[str, FakeRepo] = {}
        self.bad = Misbehaviour()
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._server: ThreadingHTTPServer | None = None
        self.stopping = threading.Event()

    # --- content ---------------------------------------------------------------------
    def add_repo(self, repo_id: str, files: dict[str, bytes], gated: bool = False, branch: str = "main") -> str:
        """A repo with one commit holding `files`; returns the commit sha."""
        sha = hashlib.sha1(repr(sorted((k, hashlib.sha256(v).hexdigest()) for k, v in files.items())).encode()).hexdigest()
        repo = self.repos.setdefault(repo_id, FakeRepo({}, {}, gated))
        repo.commits[sha] = dict(files)
        repo.refs[branch] = sha
        return sha

    @staticmethod
    def folder_files(folder: Path) -> dict[str, bytes]:
        return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}

    # --- lifecycle -------------------------------------------------------------------
    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def gets(self, needle: str) -> list[dict[str, str]]:
        """Headers of every GET whose path contains `needle`."""
        return [h for m, p, h in self.requests if m == "GET" and needle in p]

    # --- what the Hub reports about a file ---------------------------------------------
    def reported(self, name: str, data: bytes) -> tuple[int, str]:
        size = self.HUGE if name in self.bad.huge else len(data)
        sha = hashlib.sha256(data).hexdigest()
        return size, ("0" * 64 if name in self.bad.wrong_sha256 else sha)


class _Handler(BaseHTTPRequestHandler):
    fake: FakeHub
    protocol_version = "HTTP/1.0"  # one request per connection: a stopped server answers nothing

    def log_message(self, *args):  # quiet
        pass

    def do_HEAD(self):
        self._route(body=False)

    def do_GET(self):
        self._route(body=True)

    # --- routing ---------------------------------------------------------------------
    def _route(self, body: bool) -> None:
        fake = self.fake
        fake.requests.append((self.command, self.path, dict(self.headers)))
        if fake.bad.silent:
            fake.stopping.wait()
            return
        if fake.bad.status is not None:
            self.send_response(fake.bad.status)
            self.send_header("Retry-After", "0")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if fake.bad.html:
            page = b"<html><body>Please log in to the guest network</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            if body:
                self.wfile.write(page)
            return
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        if parts[:1] == ["cdn"] and len(parts) == 2:
            return self._cdn(parts[1], body)
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo_id = "/".join(parts[2:4])
            rest = parts[4:]
            if not rest:
                return self._info(repo_id, None)
            if rest[0] == "revision" and len(rest) == 2:
                return self._info(repo_id, rest[1])
            if rest[0] == "tree" and len(rest) >= 2:
                return self._tree(repo_id, rest[1])
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]), body)
        self._error(404, "EntryNotFound", "not served by the fake hub")

    # --- endpoints -------------------------------------------------------------------
    def _repo_at(self, repo_id: str, revision: str | None):
        repo = self.fake.repos.get(repo_id)
        if repo is None:
            self._error(401, "RepoNotFound", "Repository not found")
            return None, None
        sha = repo.resolve(revision)
        if sha is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None, None
        return repo, sha

    def _info(self, repo_id: str, revision: str | None) -> None:
        repo, sha = self._repo_at(repo_id, revision)
        if repo is not None:  # the model_info JSON: siblings, LFS details under "sha256"
            siblings = [{"rfilename": name, "size": size, "blobId": oid} | ({"lfs": {"sha256": lfs, "size": size,
                        "pointerSize": 134}} if lfs else {}) for name, size, oid, lfs in self._files(repo, sha)]  # fmt: skip
            self._json({"id": repo_id, "sha": sha, "private": False, "gated": "manual" if repo.gated else False,
                        "siblings": siblings})  # fmt: skip

    def _tree(self, repo_id: str, revision: str) -> None:
        repo, sha = self._repo_at(repo_id, revision)
        if repo is not None:  # the tree JSON: paths, LFS details under "oid"
            self._json([{"type": "file", "path": name, "size": size, "oid": oid} | ({"lfs": {"oid": lfs, "size": size,
                        "pointerSize": 134}} if lfs else {}) for name, size, oid, lfs in self._files(repo, sha)])  # fmt: skip

    def _files(self, repo: FakeRepo, sha: str):
        """(name, reported size, git blob id, reported sha256 or None if not an LFS file)."""
        for name, data in sorted(repo.commits[sha].items()):
            size, sha256 = self.fake.reported(name, data)
            yield name, size, git_blob_sha1(data), sha256 if name.endswith(LFS_SUFFIXES) else None

    def _resolve(self, repo_id: str, revision: str, name: str, body: bool) -> None:
        repo, sha = self._repo_at(repo_id, revision)
        if repo is None:
            return
        if repo.gated:
            auth = self.headers.get("Authorization")
            if auth != f"Bearer {FakeHub.TOKEN}":
                return self._error(403 if auth else 401, "GatedRepo", f"Access to model {repo_id} is restricted.")
        data = repo.commits[sha].get(name)
        if data is None:
            return self._error(404, "EntryNotFound", f"{name} does not exist", commit=sha)
        size, sha256 = self.fake.reported(name, data)
        if name.endswith(LFS_SUFFIXES):
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{self.fake.port}/cdn/{hashlib.sha256(data).hexdigest()}")
            self.send_header("X-Linked-Etag", f'"{sha256}"')
            self.send_header("X-Linked-Size", str(size))
            self.send_header("X-Repo-Commit", sha)
            self.send_header("ETag", f'"{git_blob_sha1(data)}"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._bytes(data, body, etag=git_blob_sha1(data), commit=sha)

    def _cdn(self, digest: str, body: bool) -> None:
        for repo in self.fake.repos.values():
            for files in repo.commits.values():
                for name, data in files.items():
                    if hashlib.sha256(data).hexdigest() == digest:
                        return self._bytes(data, body, etag=digest, name=name)
        self._error(404, None, "no such blob")

    # --- responses -------------------------------------------------------------------
    def _bytes(self, data: bytes, body: bool, etag: str, commit: str | None = None, name: str | None = None):
        start = 0
        ranged = self.headers.get("Range", "")
        if ranged.startswith("bytes=") and ranged.endswith("-"):
            start = int(ranged[len("bytes=") : -1])
        part = data[start:]
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(part)))
        self.send_header("ETag", f'"{etag}"')
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.end_headers()
        if not body:
            return
        bad = self.fake.bad
        if name is not None and bad.drops_left.get(name, 0) > 0:
            bad.drops_left[name] -= 1
            cut = max(0, bad.drop_after.get(name, 0) - start)
            self.wfile.write(part[:cut])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)  # the connection drops mid-file
            return
        if name in bad.while_sending:
            self.wfile.write(part[: len(part) // 2])
            self.wfile.flush()
            bad.while_sending[name]()
            part = part[len(part) // 2 :]
        self.wfile.write(part)

    def _json(self, payload) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(data)

    def _error(self, status: int, code: str | None, message: str, commit: str | None = None) -> None:
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(data)


def set_hub_env(env: dict[str, str | None]) -> None:
    """Set (None: unset) HF_* variables and make huggingface_hub read them again: the client
    reads its environment once, when `huggingface_hub.constants` is imported."""
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    import huggingface_hub.constants

    importlib.reload(huggingface_hub.constants)
