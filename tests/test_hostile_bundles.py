"""Bundles made by someone else: a link or a named pipe at any file a bundle holds.

Every command that reads or writes a bundle is run (in process) on a copy of one tiny bundle
with one of its files (or folders) replaced by a link to a copy elsewhere (a "sentinel"
folder), a dangling link into that folder, or a FIFO. Each must answer with one
`ssmport: error:` line naming the entry, exit 2, and change nothing: neither the bundle nor
the sentinel folder a link points into (a planted `gate.json -> ~/.bashrc` must never be
written through; a FIFO must never be opened, it would hang the reader).
"""

from __future__ import annotations

import os
import shutil

import pytest

from ssmport.cli.main import INTERNAL_ERROR
from test_bad_inputs import run_in_process, tree_state

ENTRIES = (
    "manifest.json", "gate.json", "model.aimodel", "model.aimodel/main.mlirb", "model.aimodel/main.hash",
    "model.aimodel/metadata.json", "tokenizer", "tokenizer/vocab.tsv",
)  # fmt: skip
KINDS = ("link", "dangling-link", "fifo")
COMMANDS = {
    "gate": lambda b, src: ["gate", b, "--prompts", "1", "--steps", "2"],
    "inspect": lambda b, src: ["inspect", b],
    "inspect-json": lambda b, src: ["inspect", "--json", b],
    "generate": lambda b, src: ["generate", b, "--tokens", "1,2", "-n", "2"],
    "chat": lambda b, src: ["chat", b, "-n", "2"],
    "logits": lambda b, src: ["logits", b, "--tokens-file", src["tokens"], "--out", b.parent / "l.npy"],
    "bench": lambda b, src: ["bench", b, "--steps", "2", "--warmup", "0", "--no-roofline"],
    "check-engine": lambda b, src: ["check-engine", b],
    "tokenize": lambda b, src: ["tokenize", b, "--text", "hi"],
    "export-overwrite": lambda b, src: ["export", src["pth"], "-o", b.parent, "--name", b.name, "--overwrite", "-q", "--no-gate"],
}  # fmt: skip


@pytest.fixture(scope="module")
def source(world_bundle, tmp_path_factory):
    bundle = world_bundle["bundle"]
    tokens = tmp_path_factory.mktemp("hostile") / "tokens.txt"
    tokens.write_text("1 2 3")
    assert sorted(str(p.relative_to(bundle)) for p in bundle.rglob("*")) == sorted(ENTRIES)
    return {"pth": world_bundle["pth"], "bundle": bundle, "tokens": tokens}


def _plant(bundle, sentinel, entry: str, kind: str) -> None:
    """Replace `entry` of `bundle` by a link to a copy of it in `sentinel`, a dangling link
    into `sentinel`, or a FIFO."""
    path = bundle / entry
    copy = sentinel / entry.replace("/", "_")
    shutil.move(path, copy)
    if kind == "link":
        path.symlink_to(copy)
    elif kind == "dangling-link":
        path.symlink_to(sentinel / "created-by-ssmport")
    else:
        os.mkfifo(path)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_hostile_bundle_is_refused_and_nothing_changes(command, entry, kind, source, tmp_path, capsys, monkeypatch):
    bundle, sentinel = tmp_path / "out" / "b", tmp_path / "sentinel"
    shutil.copytree(source["bundle"], bundle)
    sentinel.mkdir()
    (sentinel / "precious.txt").write_text("the user's file")
    _plant(bundle, sentinel, entry, kind)
    before = tree_state([tmp_path])
    code, out, err = run_in_process(COMMANDS[command](bundle, source), b"hello\n", capsys, monkeypatch)
    assert tree_state([tmp_path]) == before, "the command changed files"
    assert INTERNAL_ERROR not in err and "Traceback" not in err + out, err
    assert err.count("\n") == 1 and err.startswith("ssmport: error:"), f"not one error line: {err!r}"
    assert code == 2, (code, err)
    assert entry.split("/")[-1] in err, err


@pytest.mark.parametrize("user_file", ["tokenizer/my-notes.txt", "model.aimodel/notes.txt", "model.aimodel/deeper/x.txt"])
def test_overwrite_keeps_user_files_one_folder_down(user_file, source, tmp_path, capsys, monkeypatch):
    bundle = tmp_path / "b"
    shutil.copytree(source["bundle"], bundle)
    (bundle / user_file).parent.mkdir(exist_ok=True)
    (bundle / user_file).write_text("mine")
    before = tree_state([tmp_path])
    code, _, err = run_in_process(COMMANDS["export-overwrite"](bundle, source), None, capsys, monkeypatch)
    assert tree_state([tmp_path]) == before
    assert code == 2 and err.count("\n") == 1, err
    assert f"holds files an export did not write ({user_file.rsplit('/', 1)[0] if 'deeper' in user_file else user_file})" in err, err


def test_overwrite_replaces_a_bundle_exactly_as_exported(source, tmp_path, capsys, monkeypatch):
    """The whole-tree check still recognizes what an export writes (tokenizer, asset, gate)."""
    bundle = tmp_path / "b"
    shutil.copytree(source["bundle"], bundle)
    (bundle / "model.aimodel" / "main.hash").write_bytes(b"old")  # changed content is still ours
    code, _, err = run_in_process(COMMANDS["export-overwrite"](bundle, source), None, capsys, monkeypatch)
    assert code == 0, err
    assert (bundle / "model.aimodel" / "main.hash").read_bytes() != b"old"
