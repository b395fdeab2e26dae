"""The training text of `rwkv7-pydoc`: the Python 3.11 documentation sources, from Debian.

    apt-get download python3.11-doc          # python3.11-doc_3.11.2-6+deb12u8_all.deb
    python tools/pydoc_corpus.py python3.11-doc_3.11.2-6+deb12u8_all.deb --out data/

Reads every `_sources/**/*.rst.txt` in the package (the reStructuredText the HTML pages were
built from; PSF License, see tools/rwkv7_pydoc/README.md), orders the files by the sha256 of
their path (a fixed shuffle, so the held-out files are a spread of the manual rather than,
say, all of `whatsnew/`), and holds out the last files of that order, at least
VALIDATION_FRACTION of the bytes, as validation. Whole files: no document is on both sides.

Writes `train.u16` and `validation.u16` (token ids as little-endian uint16: byte b is id
b + 1, and id 0, the World vocab's end of text, starts every document) and `corpus.json`
(the package, its sha256, and every file with its size, sha256 and split).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np

PACKAGE = "python3.11-doc"
VERSION = "3.11.2-6+deb12u8"
DEB_SHA256 = "50eb63e7f636c4281e9ce1b8f10386f1def42159eddce34fc1f41c46261df71b"
SOURCES_DIR = "./usr/share/doc/python3.11/html/_sources/"
VALIDATION_FRACTION = 0.02
END_OF_TEXT = 0  # id 0: the World vocab's end of text; byte b is id b + 1


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_sources(deb: Path) -> dict[str, bytes]:
    """{path under _sources/: bytes} of every .rst.txt in the package (dpkg-deb unpacks it)."""
    tar_bytes = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], check=True, capture_output=True).stdout
    docs = {}
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        for member in tar:
            if member.isfile() and member.name.startswith(SOURCES_DIR) and member.name.endswith(".rst.txt"):
                docs[member.name.removeprefix(SOURCES_DIR)] = tar.extractfile(member).read()
    return docs


def split(docs: dict[str, bytes]) -> tuple[list[str], list[str]]:
    """(train paths, validation paths), each in the fixed shuffled order."""
    order = sorted(docs, key=lambda p: sha256(p.encode()))
    total = sum(map(len, docs.values()))
    held, n = 0, len(order)
    while held < VALIDATION_FRACTION * total:
        n -= 1
        held += len(docs[order[n]])
    return order[:n], order[n:]


def encode(docs: dict[str, bytes], paths: list[str]) -> np.ndarray:
    """Token ids: each document as END_OF_TEXT followed by its bytes + 1."""
    parts = []
    for path in paths:
        parts.append(np.array([END_OF_TEXT], dtype=np.uint16))
        parts.append(np.frombuffer(docs[path], dtype=np.uint8).astype(np.uint16) + 1)
    return np.concatenate(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("deb", type=Path, help=f"the {PACKAGE} {VERSION} .deb (apt-get download {PACKAGE})")
    p.add_argument("--out", type=Path, required=True, help="directory for train.u16, validation.u16, corpus.json")
    args = p.parse_args(argv)

    digest = sha256(args.deb.read_bytes())
    if digest != DEB_SHA256:
        print(f"{args.deb}: sha256 {digest}, expected {DEB_SHA256} ({PACKAGE} {VERSION})", file=sys.stderr)
        return 2
    docs = read_sources(args.deb)
    train, validation = split(docs)
    args.out.mkdir(parents=True, exist_ok=True)
    streams = {"train": encode(docs, train), "validation": encode(docs, validation)}
    for name, ids in streams.items():
        ids.astype("<u2").tofile(args.out / f"{name}.u16")
    manifest = {
        "package": PACKAGE,
        "version": VERSION,
        "deb_sha256": DEB_SHA256,
        "licence": "PSF License Agreement (Python documentation); code in the docs also 0BSD",
        "sources": SOURCES_DIR,
        "order": "sha256 of the path; validation = the tail holding >= 2% of the bytes",
        "tokens": {name: int(ids.size) for name, ids in streams.items()},
        "stream_sha256": {name: sha256(ids.astype("<u2").tobytes()) for name, ids in streams.items()},
        "files": [
            {"path": path, "bytes": len(docs[path]), "sha256": sha256(docs[path]), "split": split_name}
            for split_name, paths in (("train", train), ("validation", validation))
            for path in paths
        ],
    }
    (args.out / "corpus.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{len(train)} train files ({streams['train'].size:,} tokens), "
          f"{len(validation)} validation files ({streams['validation'].size:,} tokens) -> {args.out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
