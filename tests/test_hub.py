"""Downloads from the Hugging Face Hub, through the real huggingface_hub client, against the
fake Hub of tests/fake_hub.py on 127.0.0.1 (HF_ENDPOINT). No test reaches anything else: the
`network` guard refuses, and the test then fails on, any connection off the loopback.

Every failure is checked like the rows of docs/errors.md: one line, no traceback, exit status
2, no bundle left; and the Hub cache is left holding no partial or unverified file.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import random
import shutil
import signal
import socket
import time
import types
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fake_hub import FakeHub, set_hub_env
from rwkv7_files import Dims, blinkdl_state_dict, fla_from_blinkdl, write_hf_folder, write_pth
from ssmport.architectures.base import HubSource, Preset
from ssmport.models.rwkv7 import RWKV7
from ssmport.loader.resolve import load_model, rebuild_source
from test_errors import assert_no_bundle, assert_one_line, run_cli

HF_KEYS = ("HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_TOKEN", "HF_HUB_DISABLE_XET")


# --- fixtures ------------------------------------------------------------------------------
class _Guard:
    """Refuses every connection and name lookup that is not the loopback."""

    def __init__(self, monkeypatch):
        self.refused: list[object] = []
        connect, getaddrinfo = socket.socket.connect, socket.getaddrinfo

        def guarded_connect(sock, address):
            if sock.family in (socket.AF_INET, socket.AF_INET6) and not ipaddress.ip_address(address[0]).is_loopback:
                self.refused.append(address)
                raise OSError(f"test network guard: refused {address}")
            return connect(sock, address)

        def guarded_getaddrinfo(host, *args, **kwargs):
            if host not in ("localhost", "127.0.0.1", "::1", None):
                self.refused.append(host)
                raise socket.gaierror(f"test network guard: refused lookup of {host}")
            return getaddrinfo(host, *args, **kwargs)

        monkeypatch.setattr(socket.socket, "connect", guarded_connect)
        monkeypatch.setattr(socket, "getaddrinfo", guarded_getaddrinfo)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A running fake Hub, the client pointed at it with a fresh cache and no token."""
    guard = _Guard(monkeypatch)
    saved = {k: os.environ.get(k) for k in HF_KEYS}
    fake = FakeHub().start()
    set_hub_env({"HF_ENDPOINT": fake.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": None,
                 "HF_HUB_OFFLINE": None, "HF_TOKEN": None, "HF_HUB_DISABLE_XET": "1"})  # fmt: skip
    fake.cache = tmp_path / "hf" / "hub"
    try:
        yield fake
    finally:
        fake.stop()
        set_hub_env(saved)
    assert guard.refused == [], f"a test tried to reach the network: {guard.refused}"


@pytest.fixture(scope="module")
def pth_bytes(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("hub-files") / "tiny.pth"
    return write_pth(path, blinkdl_state_dict(Dims(), seed=21)).read_bytes()


@pytest.fixture(scope="module")
def fla_files(tmp_path_factory, pth_bytes) -> dict[str, bytes]:
    """An fla-layout model folder (3 shards + index), plus files an export must not fetch."""
    root = tmp_path_factory.mktemp("hub-fla")
    sd = torch.load(write_pth(root / "src.pth", blinkdl_state_dict(Dims(), seed=22)), weights_only=True)
    config, tensors = fla_from_blinkdl(sd, Dims())
    files = FakeHub.folder_files(write_hf_folder(root / "folder", config, tensors, shards=3))
    files |= {"README.md": b"# tiny\n", "model-q4.gguf": b"GGUF" * 64, "onnx/model.onnx": b"onnx" * 64,
              "pytorch_model.bin": pth_bytes, "rwkv_vocab_v20230424.txt": _vocab_txt()}  # fmt: skip
    return files


def _vocab_txt() -> bytes:
    """A World-format vocab of 256 single bytes (ids 1..256 < the tiny model's 320 rows)."""
    return "".join(f"{i + 1} {ascii(bytes([i]))} 1\n" for i in range(256)).encode()


@pytest.fixture
def hub_preset(monkeypatch):
    """A released RWKV-7 preset with the tiny test dims whose source is the fake Hub."""
    d = Dims()
    config = {"vocab_size": d.vocab, "hidden_size": d.width, "num_layers": d.layers, "head_size": d.head,
              "ffn_size": d.ffn, "decay_lora": d.d_w, "a_lora": d.d_a, "v_lora": d.d_v, "gate_lora": d.d_g}  # fmt: skip
    preset = Preset("rwkv7-hubtest", "rwkv7", config, "test preset on the fake Hub", True,
                    HubSource("BlinkDL/rwkv-7-test", "rwkv7-tiny-20260101-ctx4096.pth", confirmed="test"))  # fmt: skip
    monkeypatch.setattr(RWKV7, "presets", (*RWKV7.presets, preset))
    return preset


def export(capsys, out, *argv):
    return run_cli(capsys, "export", *argv, "-o", out, "--quant", "fp32", "-q")


def fails(capsys, tmp_path, message, *argv):
    out = tmp_path / "out"
    assert_one_line(*export(capsys, out, *argv, "--no-gate"), message)
    assert_no_bundle(out)


def cache_files(cache: Path) -> list[str]:
    """Every file under the Hub cache's blobs/ and snapshots/ (links included)."""
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file() or p.is_symlink()
                  if "/blobs/" in f"/{p.relative_to(cache)}" or "/snapshots/" in f"/{p.relative_to(cache)}")  # fmt: skip


# --- downloads that work -------------------------------------------------------------------
def test_preset_downloads_its_file_and_exports(hub, hub_preset, pth_bytes, tmp_path, capsys):
    """`ssmport export PRESET` with no --weights: the preset's one file from its repo, into the
    Hub cache, verified, provenance in the manifest; then the usual export and gate."""
    sha = hub.add_repo(hub_preset.hub.repo, {hub_preset.hub.file: pth_bytes, "other-20250101.pth": b"x" * 999,
                                              "README.md": b"hello"})  # fmt: skip
    code, out, err = export(capsys, tmp_path / "out", "rwkv7-hubtest", "--gate-steps", 2)
    assert code == 0, err
    assert "gate: PASS" in out
    manifest = json.loads((tmp_path / "out" / "rwkv7-hubtest-fp32" / "manifest.json").read_text())
    source = manifest["source"]
    assert source["preset"] == "rwkv7-hubtest" and source["kind"] == "pth"
    assert source["hub"] == {"repo": "BlinkDL/rwkv-7-test", "revision": None, "commit": sha,
                             "file": hub_preset.hub.file,
                             "files": [{"name": hub_preset.hub.file, "size": len(pth_bytes),
                                        "sha256": hashlib.sha256(pth_bytes).hexdigest()}]}  # fmt: skip
    assert Path(source["path"]).is_relative_to(hub.cache)
    # only the preset's file came: not the repo's other checkpoint, not its README
    assert len(hub.gets("/cdn/")) == 1 and not hub.gets("other-") and not hub.gets("README")
    # a gate or `logits --backend torch` later, the cache emptied meanwhile: the source is
    # fetched again at the recorded commit
    shutil.rmtree(hub.cache)
    again = rebuild_source(source)
    assert again.provenance["hub"]["commit"] == sha and len(hub.gets("/cdn/")) == 2


def test_repo_at_commit_then_again_from_the_cache_with_the_hub_gone(hub, fla_files, tmp_path, capsys):
    """`ssmport export org/repo@sha`: config, index, shards and the tokenizer, nothing else;
    a second export with the server stopped runs from the cache alone, and says so."""
    sha = hub.add_repo("fla-hub/rwkv7-tiny-world", fla_files)
    hub.add_repo("fla-hub/rwkv7-tiny-world", {"config.json": b"{}"}, branch="main")  # main moved on: @sha must win
    code, out, err = export(capsys, tmp_path / "a", f"fla-hub/rwkv7-tiny-world@{sha}", "--no-gate")
    assert code == 0, err
    fetched = sorted(p for m, p, _ in hub.requests if m == "HEAD")
    wanted = ["config.json", "model.safetensors.index.json", "rwkv_vocab_v20230424.txt"]
    wanted += sorted(n for n in fla_files if n.startswith("model-0"))
    assert [p.rsplit("/", 1)[1] for p in fetched] == sorted(wanted)
    manifest = json.loads((tmp_path / "a" / "rwkv7-tiny-world-fp32" / "manifest.json").read_text())
    assert manifest["source"]["hub"]["commit"] == sha and manifest["source"]["hub"]["revision"] == sha
    assert {f["name"]: f["sha256"] for f in manifest["source"]["hub"]["files"]} == {
        n: hashlib.sha256(fla_files[n]).hexdigest() for n in wanted
    }
    assert manifest["tokenizer"]["kind"] == "rwkv-world"

    hub.stop()
    requests = len(hub.requests)
    code, out, err = export(capsys, tmp_path / "b", f"fla-hub/rwkv7-tiny-world@{sha}", "--no-gate")
    assert code == 0, err
    assert "could not be reached" in err and "used the cached copy" in err
    assert len(hub.requests) == requests  # nothing was asked of anyone


def test_each_architectures_folder_layout(hub, tmp_path):
    """A state-spaces Mamba-2 repo (mamba_ssm config.json + pytorch_model.bin) and an fla Gated
    DeltaNet repo (2 shards): each loads by its own loader from exactly the files it reads."""
    from gdn_files import GDNDims, write_gdn_folder
    from mamba2_files import Geometry, write_mamba_ssm_folder

    folders = {
        "state-spaces/mamba2-tiny": ("mamba2", write_mamba_ssm_folder(tmp_path / "m", Geometry(vocab=176, groups=1),
                                                                      seed=8, vocab_unpadded=170)),
        "fla-hub/gdn-tiny": ("gated_deltanet", write_gdn_folder(tmp_path / "g", GDNDims(), seed=3, shards=2)),
    }
    for repo, (arch, folder) in folders.items():
        files = FakeHub.folder_files(folder)
        hub.add_repo(repo, files | {"model.gguf": b"GGUF" * 99, "tokenizer_config.json": b"{}"})
        model = load_model(repo)
        assert model.architecture.name == arch
        assert sorted(f["name"] for f in model.provenance["hub"]["files"]) == sorted(files)
        assert not hub.gets("model.gguf") and not hub.gets("tokenizer_config")


def test_offline_mode_uses_the_cache(hub, hub_preset, pth_bytes):
    hub.add_repo(hub_preset.hub.repo, {hub_preset.hub.file: pth_bytes})
    online = load_model("rwkv7-hubtest")
    set_hub_env({"HF_HUB_OFFLINE": "1"})
    requests = len(hub.requests)
    offline = load_model("rwkv7-hubtest")
    assert len(hub.requests) == requests
    assert offline.notes == []  # offline by choice: nothing to warn about
    assert offline.provenance == online.provenance


def test_gated_repo_needs_a_token(hub, hub_preset, pth_bytes, tmp_path, capsys):
    hub.add_repo(hub_preset.hub.repo, {hub_preset.hub.file: pth_bytes}, gated=True)
    fails(capsys, tmp_path, "BlinkDL/rwkv-7-test is gated: accept its terms on the Hub, then set HF_TOKEN",
          "rwkv7-hubtest")
    assert not hub.gets("/cdn/")
    set_hub_env({"HF_TOKEN": "hf_not_this_one"})
    fails(capsys, tmp_path, "BlinkDL/rwkv-7-test is gated", "rwkv7-hubtest")  # the Hub's 403
    assert any(m == "HEAD" for m, _, _ in hub.requests)
    set_hub_env({"HF_TOKEN": FakeHub.TOKEN})
    assert load_model("rwkv7-hubtest").provenance["hub"]["files"][0]["size"] == len(pth_bytes)


# --- what goes wrong -------------------------------------------------------------------------
def test_offline_with_nothing_cached(hub, hub_preset, tmp_path, capsys):
    set_hub_env({"HF_HUB_OFFLINE": "1"})
    fails(capsys, tmp_path, "BlinkDL/rwkv-7-test: not in the Hugging Face cache", "rwkv7-hubtest")
    assert hub.requests == []


def test_no_network_with_nothing_cached(hub, hub_preset, tmp_path, capsys):
    hub.stop()
    fails(capsys, tmp_path, "not in the Hugging Face cache", "rwkv7-hubtest")


def test_unknown_repo(hub, tmp_path, capsys):
    fails(capsys, tmp_path, "nobody/nothing: no such model repository on the Hub (nor a local path)", "nobody/nothing")


def test_an_invalid_repo_id(hub, tmp_path, capsys):
    fails(capsys, tmp_path, "h/..: not a valid Hub repo id", "h/..")  # was HFValidationError (exit 70)


def test_a_captive_portal_answering_200_with_html(hub, tmp_path, capsys):
    hub.bad.html = True  # was JSONDecodeError (exit 70)
    fails(capsys, tmp_path, "org/repo: the Hub's answer is not JSON", "org/repo")


@pytest.mark.parametrize("status", [500, 429])
def test_a_hub_that_answers_errors_is_one_line(hub, tmp_path, capsys, status):
    hub.bad.status = status
    fails(capsys, tmp_path, "org/repo: ", "org/repo")


def test_a_hub_that_never_answers_times_out(hub, tmp_path, capsys, monkeypatch):
    """The client's requests had no timeout: a server that accepts and never answers hung the
    export forever. HF_HUB_ETAG_TIMEOUT / HF_HUB_DOWNLOAD_TIMEOUT bound each wait."""
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "1")
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "1")
    hub.bad.silent = True
    started = time.monotonic()
    fails(capsys, tmp_path, "the Hub cannot be used (timed out)", "org/repo")
    assert time.monotonic() - started < 40


def test_sigterm_while_the_hub_read_is_blocked(hub, tmp_path, capsys, monkeypatch, terminal_signals):
    """SIGTERM while the client waits on a server that never answers: it waited for a safe
    point the blocked read never reached (until the timeout, or forever without one). Nothing
    is written yet, so the export stops at once: exit 143, one line, nothing left."""
    import threading

    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "60")
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "60")
    hub.bad.silent = True
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    started = time.monotonic()
    code, out, err = export(capsys, tmp_path / "out", "org/repo", "--no-gate")
    assert (code, err) == (143, "ssmport: terminated (SIGTERM)\n")
    assert time.monotonic() - started < 10
    assert_no_bundle(tmp_path / "out")
    assert cache_files(hub.cache) == []


@pytest.mark.parametrize("cache", ["a file", "read-only"])
def test_an_unusable_hub_cache_is_one_line(hub, pth_bytes, tmp_path, capsys, cache):
    """HF_HUB_CACHE that is a file, or on a read-only filesystem (/proc: read-only even for
    root): one line naming it, not the client's multi-line chatter."""
    hub.add_repo("org/tiny", {"tiny.pth": pth_bytes})
    path = tmp_path / "cache-file" if cache == "a file" else Path("/proc/ssmport-hub-cache")
    if cache == "a file":
        path.write_text("not a folder")
    set_hub_env({"HF_HUB_CACHE": str(path)})
    said = "org/tiny: download failed" if cache == "a file" else "the Hub cache /proc/ssmport-hub-cache cannot be written"
    fails(capsys, tmp_path, said, "org/tiny")


def test_unknown_revision(hub, pth_bytes, tmp_path, capsys):
    hub.add_repo("org/tiny", {"tiny.pth": pth_bytes})
    fails(capsys, tmp_path, "org/tiny@v9: the repo has no revision 'v9'", "org/tiny@v9")


def test_repo_of_no_known_architecture(hub, tmp_path, capsys):
    config = json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}).encode()
    hub.add_repo("meta/llama-tiny", {"config.json": config, "model.safetensors": b"\0" * 4096})
    fails(capsys, tmp_path, "model_type 'llama' is not supported", "meta/llama-tiny")
    assert not hub.gets("/cdn/")  # refused from config.json, before any weights came


def test_several_checkpoints_need_file(hub, pth_bytes, tmp_path, capsys):
    hub.add_repo("BlinkDL/several", {"a-0.1b.pth": pth_bytes, "b-0.4b.pth": pth_bytes + b"\0"})
    fails(capsys, tmp_path, "BlinkDL/several holds 2 .pth checkpoints; pick one with --file (e.g. a-0.1b.pth, b-0.4b.pth)",
          "BlinkDL/several")  # fmt: skip
    fails(capsys, tmp_path, "BlinkDL/several has no file 'c.pth'", "BlinkDL/several", "--file", "c.pth")
    model = load_model("BlinkDL/several", file="a-0.1b.pth")
    assert model.name == "a-0.1b" and model.provenance["hub"]["file"] == "a-0.1b.pth"


def test_dropped_connection_resumes(hub, tmp_path):
    """The server cuts a 24 MB file at 60%: the client asks for the rest (Range, from the last
    whole 10 MB chunk it wrote) and the cached file is whole and verified."""
    from ssmport.loader.hub import fetch

    data = random.Random(5).randbytes(24 << 20)
    hub.add_repo("org/big", {"big.pth": data})
    hub.bad.drop_after["big.pth"], hub.bad.drops_left["big.pth"] = len(data) * 3 // 5, 1
    got = fetch("org/big")
    first, second = [h.get("Range") or h.get("range") for h in hub.gets("/cdn/")]
    assert first is None and second.startswith("bytes=")
    assert 0 < int(second[len("bytes=") : -1]) <= len(data) * 3 // 5  # resumed, not restarted
    assert got.path.read_bytes() == data
    assert got.provenance["files"] == [{"name": "big.pth", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}]


def test_download_that_keeps_failing_leaves_nothing(hub, hub_preset, pth_bytes, tmp_path, capsys, monkeypatch):
    """Every attempt dropped: one line, no partial file anywhere in the cache, and the next run
    downloads afresh."""
    import huggingface_hub.file_download as client

    no_wait = types.SimpleNamespace(**{k: getattr(client.time, k) for k in dir(client.time) if not k.startswith("_")})
    no_wait.sleep = lambda seconds: None  # the client waits 1 s between its 5 retries
    monkeypatch.setattr(client, "time", no_wait)
    hub.add_repo(hub_preset.hub.repo, {hub_preset.hub.file: pth_bytes})
    hub.bad.drop_after[hub_preset.hub.file], hub.bad.drops_left[hub_preset.hub.file] = 1000, 100
    fails(capsys, tmp_path, "download failed", "rwkv7-hubtest")
    assert len(hub.gets("/cdn/")) == 6  # the first try and the client's 5 retries
    assert cache_files(hub.cache) == []
    hub.bad.drops_left.clear()
    assert load_model("rwkv7-hubtest").provenance["hub"]["files"][0]["size"] == len(pth_bytes)


def test_ctrl_c_during_the_download(hub, hub_preset, pth_bytes, tmp_path, capsys, terminal_signals):
    """Ctrl-C while the file arrives: exit 130, the partial file discarded, nothing exported."""
    hub.add_repo(hub_preset.hub.repo, {hub_preset.hub.file: pth_bytes})
    hub.bad.while_sending[hub_preset.hub.file] = lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.2))
    code, out, err = export(capsys, tmp_path / "out", "rwkv7-hubtest", "--no-gate")
    assert (code, err) == (130, "ssmport: interrupted\n")
    assert_no_bundle(tmp_path / "out")
    assert cache_files(hub.cache) == []


def test_wrong_checksum_is_removed_from_the_cache(hub, hub_preset, pth_bytes, tmp_path, capsys):
    hub.add_repo(hub_preset.hub.repo, {hub_preset.hub.file: pth_bytes})
    hub.bad.wrong_sha256.add(hub_preset.hub.file)
    fails(capsys, tmp_path, f"{hub_preset.hub.file}: sha256 {hashlib.sha256(pth_bytes).hexdigest()} does not match "
          "the Hub's 0000", "rwkv7-hubtest")  # fmt: skip
    assert cache_files(hub.cache) == []  # neither the blob nor its snapshot link is left
    hub.bad.wrong_sha256.clear()
    assert load_model("rwkv7-hubtest").provenance["hub"]["files"][0]["sha256"] == hashlib.sha256(pth_bytes).hexdigest()


def test_not_enough_disk_space(hub, hub_preset, pth_bytes, tmp_path, capsys):
    hub.add_repo(hub_preset.hub.repo, {hub_preset.hub.file: pth_bytes})
    hub.bad.huge.add(hub_preset.hub.file)
    fails(capsys, tmp_path, "BlinkDL/rwkv-7-test: the download needs 1000000.0 GB (1 file) but", "rwkv7-hubtest")
    assert not [p for m, p, _ in hub.requests if m == "HEAD" or "/cdn/" in p]  # refused before the transfer


def test_the_real_presets_name_their_source(hub, pth_bytes, tmp_path, capsys):
    """`ssmport export rwkv7-1.5b` (the mission line) asks the Hub for exactly the preset's
    file; a checkpoint that is not a 1.5B is refused by the preset's dims, in one line."""
    from ssmport.architectures import presets

    source = presets()["rwkv7-1.5b"].hub
    assert (source.repo, source.file) == ("BlinkDL/rwkv-7-world", "RWKV-x070-World-1.5B-v3-20250127-ctx4096.pth")
    hub.add_repo(source.repo, {source.file: pth_bytes, "RWKV-x070-World-0.1B-v2.8-20241210-ctx4096.pth": b"0" * 99})
    fails(capsys, tmp_path, "does not match preset rwkv7-1.5b: vocab_size=320 (preset 65536)", "rwkv7-1.5b",
          "--quant", "int8keepproj")  # fmt: skip
    assert [p.rsplit("/", 1)[1] for m, p, _ in hub.requests if m == "HEAD"] == [source.file]


def test_list_shows_sources(capsys, monkeypatch):
    from ssmport.architectures import presets

    unconfirmed = replace(presets()["rwkv7-0.1b"], name="rwkv7-unsure", hub=HubSource("BlinkDL/x", "y.pth"))
    monkeypatch.setattr(RWKV7, "presets", (*RWKV7.presets, unconfirmed))
    code, out, _ = run_cli(capsys, "list")
    assert code == 0
    assert "[Hub BlinkDL/rwkv-7-world: RWKV-x070-World-1.5B-v3-20250127-ctx4096.pth]" in out
    assert "[Hub state-spaces/mamba2-130m]" in out
    assert "[Hub BlinkDL/x: y.pth; source not confirmed]" in out
    assert "gated-deltanet-1.3b" in out and "no download source" in out


def test_a_tokenizer_json_comes_with_its_config_and_chat_template(hub, tmp_path):
    """A released-style Qwen3.5 repo (VLM packaging, 2 shards, tokenizer.json): its
    tokenizer_config.json and chat_template.jinja are fetched too (`ssmport chat` renders them),
    nothing else is (generation_config.json, the card, other formats)."""
    from hybrid_files import Qwen35Dims, write_qwen35_vlm

    folder = write_qwen35_vlm(tmp_path / "q", Qwen35Dims(), seed=4)
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    files = FakeHub.folder_files(folder)
    hub.add_repo("Qwen/Qwen3.5-tiny-test", files | {"README.md": b"# card", "model.gguf": b"GGUF" * 99})
    model = load_model("Qwen/Qwen3.5-tiny-test")
    assert model.architecture.name == "qwen3_5"
    fetched = sorted(f["name"] for f in model.provenance["hub"]["files"])
    assert fetched == sorted(set(files) - {"generation_config.json"})
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= set(fetched)
