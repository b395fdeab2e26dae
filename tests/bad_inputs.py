"""The bad-input table: every case a demanding user might try, and what ssmport must say.

Each `Case` builds what it needs under its own folder (`Env.tmp`) from a few shared files and
bundles (made once per session by tests/test_bad_inputs.py), and names the command line. The
harness runs each one and asserts: exactly one `ssmport: error:` line containing `message`,
the exit status `code`, no traceback and no "internal error" line, and that every file of the
watched trees (the case's folder and the shared files) is byte for byte what it was, with
nothing added: no partial output, nothing destroyed.

docs/errors.md's table is generated from this list (`python tests/bad_inputs.py` rewrites
it; tests/test_bad_inputs.py checks that it is current).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

NON_UTF8 = os.fsdecode(b"bad-\xff\xfe-name")  # how Linux hands undecodable bytes to Python


@dataclass
class Env:
    """What a case may use. Shared paths are read-only: the harness hashes them around
    every case. `tmp` is the case's own folder (also hashed: nothing may appear in it)."""

    tmp: Path
    tok: Path  # a bundle with a World tokenizer and a prefill function (from `rwkv_pth`)
    plain: Path  # a bundle with no tokenizer (from `pth`)
    pth: Path  # the source of `plain`
    rwkv_pth: Path  # the source of `tok` (its vocab beside it)
    other_pth: Path  # same shapes as `pth`, other weights
    small_pth: Path  # another RWKV-7 size
    vocab: Path  # the small World vocab of `tok`
    fla: Path  # `pth` as an fla folder, 2 shards
    m2: Path  # a transformers Mamba-2 folder
    gdn: Path  # an fla Gated DeltaNet folder
    snapshot: Path  # a state snapshot of `tok`
    moe: Path  # a transformers LFM2-MoE folder
    nemotron_moe: Path  # a transformers Nemotron-H folder with grouped MoE layers (12 experts, 3 groups, top 3 of 2 groups)
    lfm3: Path  # a transformers LFM3 folder (sliding-window rings, per-kind RoPE)
    rgemma: Path  # a transformers RecurrentGemma folder (local attention over a ring)
    rwkv6_pth: Path  # a BlinkDL RWKV-6 (x060) .pth
    spec: Path  # `tok`'s source exported with --verify 4 (speculative decoding); `tok` can draft for it
    setup_done: list = field(default_factory=list)  # undo callbacks (chattr -i, locks)

    def path(self, name: str) -> Path:
        return self.tmp / name

    def write(self, name: str, data: str | bytes) -> Path:
        p = self.tmp / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
        return p

    def copy(self, src: Path, name: str | None = None) -> Path:
        dst = self.tmp / (name or src.name)
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            shutil.copy2(src, dst)
        return dst

    def edit_json(self, path: Path, edit: Callable[[dict], object]) -> Path:
        """Edit a JSON file in place (`edit` mutates it; a `_whole` edit returns a new document)."""
        data = json.loads(path.read_text())
        result = edit(data)
        path.write_text(json.dumps(result if getattr(edit, "whole", False) else data))
        return path

    def bundle(self, edit: Callable[[dict], object] | None = None, src: Path | None = None, name: str = "b") -> Path:
        """A private copy of `tok` (or `src`), its manifest edited."""
        b = self.copy(src or self.tok, name)
        if edit is not None:
            self.edit_json(b / "manifest.json", edit)
        return b

    def folder(self, src: Path, edit: Callable[[dict], object] | None = None, name: str = "m") -> Path:
        """A private copy of a Hugging Face folder, its config.json edited."""
        f = self.copy(src, name)
        if edit is not None:
            self.edit_json(f / "config.json", edit)
        return f

    def immutable(self, path: Path) -> Path:
        """Make `path` unwritable even for root (chattr +i); undone after the case."""
        import subprocess

        import pytest

        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not available here (it needs root and a filesystem that supports it)")
        self.setup_done.append(lambda: subprocess.run(["chattr", "-i", str(path)], check=False))
        return path


@dataclass(frozen=True)
class Case:
    id: str
    command: str  # the subcommand ("ssmport" for options of the program itself)
    what: str  # the bad input, in words (the docs' first column)
    argv: Callable[[Env], list]
    message: str  # part of the one error line (the docs' last column)
    code: int = 2
    process: bool = False  # run in a child process: it needs a real stdout, or a crash must not kill the tests
    stdin: bytes | None = None
    env: Callable[[Env], dict] | None = None


CASES: list[Case] = []


def case(id, command, what, argv, message, **kw):
    CASES.append(Case(id, command, what, argv, message, **kw))


def _set(key, value):
    def edit(d):
        d[key] = value

    return edit


def _drop(key):
    return lambda d: d.pop(key)


def _whole(edit):
    """An edit that returns the whole new JSON document instead of changing it in place."""
    edit.whole = True
    return edit


def _state_dict(e: Env, edit: Callable[[dict], None], name: str = "x.pth") -> Path:
    import torch

    sd = torch.load(e.pth, weights_only=True)
    edit(sd)
    path = e.path(name)
    torch.save(sd, path)
    return path


def _index_edit(e: Env, edit: Callable[[dict], object]) -> Path:
    f = e.copy(e.fla, "hf")
    e.edit_json(f / "model.safetensors.index.json", edit)
    return f


def _add_tensor(e: Env, src: Path, name: str) -> Path:
    """A copy of a single-file HF folder with one more tensor in its safetensors."""
    from safetensors.torch import load_file, save_file
    import torch

    f = e.copy(src, "hf")
    tensors = load_file(f / "model.safetensors")
    tensors[name] = torch.zeros(1)
    save_file(tensors, str(f / "model.safetensors"))
    return f


def _export(*extra):
    return lambda e: ["export", *extra]


def _out(e: Env) -> list:
    return ["-o", e.path("out"), "-q", "--no-gate"]


def _config_cases(family: str, fixture: str, rows) -> None:
    """Export cases of a family's config.json: each row (id, what, an edit of the config, the
    message) exports the table's `fixture` folder (an Env attribute) with that edit."""
    for cid, what, edit, message in rows:
        case(cid, "export", f"{family} config.json: {what}",
             lambda e, edit=edit: ["export", e.folder(getattr(e, fixture), edit), *_out(e)], message)  # fmt: skip


# === the program itself =====================================================================
case("no-command", "ssmport", "no subcommand", lambda e: [], "the following arguments are required: COMMAND")
case("unknown-command", "ssmport", "an unknown subcommand", lambda e: ["frobnicate"], "invalid choice: 'frobnicate'")
case("unknown-option", "ssmport", "an unknown option", lambda e: ["list", "--frobnicate"], "unrecognized arguments: --frobnicate")
for sub, argv in (("export", lambda e: ["export", e.path(NON_UTF8)]), ("gate", lambda e: ["gate", e.path(NON_UTF8)]),
                  ("logits", lambda e: ["logits", e.tok, "--tokens-file", e.path(NON_UTF8), "--out", e.path("o.npy")]),
                  ("generate", lambda e: ["generate", e.path(NON_UTF8), "--tokens", "1"]),
                  ("chat", lambda e: ["chat", e.tok, "--script", e.path(NON_UTF8)]),
                  ("inspect", lambda e: ["inspect", e.path(NON_UTF8)]), ("bench", lambda e: ["bench", e.path(NON_UTF8)]),
                  ("check-engine", lambda e: ["check-engine", e.path(NON_UTF8)]),
                  ("tokenize", lambda e: ["tokenize", e.vocab, "--text", NON_UTF8]),
                  ("tokenizer", lambda e: ["tokenizer", "export", e.vocab, "-o", e.path(NON_UTF8)])):  # fmt: skip
    case(f"{sub}-non-utf8-argument", sub, "an argument with bytes that are not UTF-8 (a path the runtime cannot encode)",
         argv, "is not valid UTF-8; ssmport takes UTF-8 paths and text")  # fmt: skip


def _plugin(e: Env, source: str) -> list:
    return ["--plugin", e.write("plugin.py", source), "list"]


case("plugin-missing", "--plugin", "a plugin file that does not exist", lambda e: ["--plugin", e.path("nope.py"), "list"], "no such file")
case("plugin-directory", "--plugin", "a plugin that is a directory", lambda e: ["--plugin", e.tmp, "list"], "no such file or importable module")
case("plugin-module-missing", "--plugin", "a plugin module that cannot be imported", lambda e: ["--plugin", "no_such_module_x", "list"],
     "no such file or importable module")  # fmt: skip
case("plugin-not-python", "--plugin", "a plugin file that is not Python (a .txt, a .so)", lambda e: ["--plugin", e.write("p.txt", "x = 1\n"), "list"],
     "not a Python file")  # fmt: skip
case("plugin-syntax-error", "--plugin", "a plugin with a syntax error", lambda e: _plugin(e, "def (\n"), "failed to import: SyntaxError")
case("plugin-raises", "--plugin", "a plugin that raises while importing", lambda e: _plugin(e, "raise RuntimeError('boom')\n"),
     "failed to import: RuntimeError: boom")  # fmt: skip
case("plugin-imports-missing", "--plugin", "a plugin importing a module that is not installed",
     lambda e: _plugin(e, "import no_such_dependency_x\n"), "failed to import: ModuleNotFoundError")  # fmt: skip
case("plugin-sys-exit-0", "--plugin", "a plugin that calls sys.exit(0) (the command must not succeed)",
     lambda e: _plugin(e, "import sys\nsys.exit(0)\n"), "sys.exit(0) at")  # fmt: skip
case("plugin-sys-exit-1", "--plugin", "a plugin that calls sys.exit(1)", lambda e: _plugin(e, "import sys\nsys.exit(1)\n"), "sys.exit(1) at")
case("plugin-sys-exit-text", "--plugin", "a plugin that calls sys.exit('message')",
     lambda e: _plugin(e, "import sys\nsys.exit('bye')\n"), "sys.exit('bye') at")  # fmt: skip
case("plugin-env-missing", "--plugin", "SSMPORT_PLUGINS naming a file that does not exist", lambda e: ["list"], "no such file",
     env=lambda e: {"SSMPORT_PLUGINS": str(e.path("gone.py"))})  # fmt: skip
case("plugin-register-twice", "--plugin", "a plugin registering a name that is taken",
     lambda e: _plugin(e, "import ssmport, dataclasses\nfrom ssmport.architectures import get_architecture\n"
                          "ssmport.register_architecture(dataclasses.replace(get_architecture('rwkv7'), presets=()))\n"),
     "already registered")  # fmt: skip
_EXITING_PLUGIN = """import sys, dataclasses, ssmport
from ssmport.architectures import get_architecture
arch = dataclasses.replace(get_architecture("mamba2"), name="exiting", presets=(), tiny_preset=None, hf_architectures=())
arch.load_hf = lambda config_json, source: sys.exit(0)
ssmport.register_architecture(arch)
"""
case("plugin-exits-during-export", "--plugin", "a plugin architecture that calls sys.exit(0) while loading a checkpoint",
     lambda e: ["--plugin", e.write("plugin.py", _EXITING_PLUGIN), "export", e.folder(e.m2, lambda d: d.update(model_type="exiting", architectures=["Exiting"])), *_out(e)],
     "sys.exit(0) at", process=True)  # fmt: skip
case("stdout-closed", "ssmport", "standard output closed (`>&-`)", lambda e: ["list"], "standard output is closed", process=True)
case("stdout-full", "ssmport", "standard output on a full disk (`>/dev/full`)", lambda e: ["list"],
     "cannot write to standard output (No space left on device)", process=True)  # fmt: skip
case("stdout-full-inspect", "inspect", "standard output on a full disk", lambda e: ["inspect", e.tok],
     "cannot write to standard output (No space left on device)", process=True)  # fmt: skip
case("cache-is-a-file", "generate", "SSMPORT_CACHE pointing at a file", lambda e: ["generate", e.tok, "--tokens", "1"],
     "not a directory (point SSMPORT_CACHE at a folder)", env=lambda e: {"SSMPORT_CACHE": str(e.write("cachefile", "x"))})  # fmt: skip
case("cache-unwritable", "generate", "SSMPORT_CACHE where nothing can be created", lambda e: ["generate", e.tok, "--tokens", "1"],
     "cannot be written", env=lambda e: {"SSMPORT_CACHE": "/proc/ssmport-cache"})  # fmt: skip
case("cache-non-utf8", "generate", "SSMPORT_CACHE with bytes that are not UTF-8", lambda e: ["generate", e.tok, "--tokens", "1"],
     "is not valid UTF-8", env=lambda e: {"SSMPORT_CACHE": str(e.path(NON_UTF8))})  # fmt: skip
case("cache-limit-not-a-size", "generate", "SSMPORT_CACHE_LIMIT that is not a size", lambda e: ["generate", e.tok, "--tokens", "1"],
     "SSMPORT_CACHE_LIMIT 'lots' is not a size", env=lambda e: {"SSMPORT_CACHE_LIMIT": "lots"})  # fmt: skip
case("cache-immutable", "generate", "SSMPORT_CACHE a folder nothing can be written to", lambda e: ["generate", e.tok, "--tokens", "1"],
     "cannot", env=lambda e: {"SSMPORT_CACHE": str(e.immutable(e.write("ro/keep", "x").parent))})  # fmt: skip

# === export: the checkpoint ================================================================
case("pth-truncated", "export", "a truncated `.pth`",
     lambda e: ["export", e.write("cut.pth", e.pth.read_bytes()[: e.pth.stat().st_size // 2]), *_out(e)],
     "not a loadable PyTorch checkpoint")  # fmt: skip
case("pth-text", "export", "a text file named `.pth`", lambda e: ["export", e.write("notes.pth", "just text\n"), *_out(e)],
     "not a loadable PyTorch checkpoint (unrecognised file format)")  # fmt: skip
case("pth-empty", "export", "an empty `.pth`", lambda e: ["export", e.write("empty.pth", b""), *_out(e)], "not a loadable PyTorch checkpoint")


def _evil(e: Env) -> list:
    import pickle
    import torch

    class Payload:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path = e.path("evil.pth")
    torch.save({"emb.weight": torch.zeros(2, 2), "x": Payload()}, path, pickle_module=pickle)
    return ["export", path, *_out(e)]


case("pth-pickle-code", "export", "a pickle that `weights_only=True` refuses (code in it); the code never runs", _evil,
     "not a loadable PyTorch checkpoint (it holds Python objects besides tensors")  # fmt: skip


def _gzipped_pth(e: Env) -> Path:
    import gzip

    return e.write("model.pth", gzip.compress(e.pth.read_bytes()))


def _safetensors_pth(e: Env) -> Path:
    import torch
    from safetensors.torch import save_file

    save_file({"emb.weight": torch.zeros(2, 2)}, str(e.path("model.pth")))
    return e.path("model.pth")


case("pth-gzip", "export", "a gzip-compressed `.pth` (torch's text: escapes and 'retry with weights_only=False')",
     lambda e: ["export", _gzipped_pth(e), *_out(e)], "not a loadable PyTorch checkpoint (it is a gzip file; decompress it first)")  # fmt: skip
case("pth-safetensors", "export", "a safetensors file named `.pth`", lambda e: ["export", _safetensors_pth(e), *_out(e)],
     "(it is a safetensors file; give its Hugging Face folder")  # fmt: skip


def _torch_save(e: Env, obj, name: str = "x.pth") -> Path:
    import torch

    path = e.path(name)
    torch.save(obj, path)
    return path


case("pth-a-list", "export", "a `.pth` holding a list, not a state dict", lambda e: ["export", _torch_save(e, [1, 2]), *_out(e)],
     "expected a flat {name: tensor} state dict")  # fmt: skip
case("pth-non-tensor", "export", "a `.pth` whose values are not all tensors",
     lambda e: ["export", _torch_save(e, {"emb.weight": 3}), *_out(e)], "expected a flat {name: tensor} state dict")  # fmt: skip
case("pth-unknown-names", "export", "a `.pth` of no architecture ssmport knows",
     lambda e: ["export", _torch_save(e, {"transformer.wte.weight": _zeros(2, 2)}), *_out(e)],
     "no registered architecture recognises")  # fmt: skip
def _pth_case(cid: str, what: str, edit: Callable[[dict], object], message: str) -> None:
    """A case: `pth` with its state dict edited (`edit(sd)`)."""
    case(cid, "export", what, lambda e: ["export", _state_dict(e, edit), *_out(e)], message)


def _zeros(*shape):
    import torch

    return torch.zeros(*shape)


_pth_case("pth-missing-tensor", "a tensor missing", lambda sd: sd.pop("blocks.1.ffn.key.weight"), "missing 1: blocks.1.ffn.key.weight")
_pth_case("pth-extra-tensor", "a tensor that does not belong", lambda sd: sd.__setitem__("blocks.0.att.surplus", _zeros(3)),
          "unexpected 1: blocks.0.att.surplus")  # fmt: skip
_pth_case("pth-misshaped", "a tensor of the wrong shape", lambda sd: sd.__setitem__("blocks.1.att.key.weight", _zeros(128, 64)),
          "misshaped 1: blocks.1.att.key.weight [128, 64]")  # fmt: skip
_pth_case("pth-int-tensor", "an integer tensor where a weight belongs",
          lambda sd: sd.__setitem__("ln_out.weight", sd["ln_out.weight"].long()), "not floating point 1: ln_out.weight int64")  # fmt: skip
for bad in ("nan", "inf"):
    _pth_case(f"pth-{bad}-weight", f"{bad.upper()} in a weight (refused: one makes every output {bad.upper()})",
              lambda sd, bad=bad: sd["blocks.1.att.value.weight"].__setitem__((3, 5), float(bad)),
              "tensor blocks.1.att.value.weight contains NaN or Inf values")  # fmt: skip
_pth_case("pth-stray-block-huge", "a stray tensor name `blocks.99999999.*` (no allocation for 10^8 layers)",
          lambda sd: sd.__setitem__("blocks.99999999.att.x_r", _zeros(1)), "tensor names reach block 99999999, beyond 1024 layers")  # fmt: skip
_pth_case("pth-stray-block", "a stray tensor name `blocks.1000.*` (the thousands of names it makes missing are not all listed)",
          lambda sd: sd.__setitem__("blocks.1000.att.x_r", _zeros(1)), "more)")  # fmt: skip
_pth_case("pth-zero-heads", "a head tensor of shape [0, 0] (nothing sized from it)",
          lambda sd: sd.__setitem__("blocks.0.att.r_k", _zeros(0, 0)), "are not an RWKV-7 model's [vocab, width] and [heads, head size]")  # fmt: skip
_pth_case("pth-1d-embedding", "a 1-D embedding", lambda sd: sd.__setitem__("emb.weight", sd["emb.weight"].reshape(-1)),
          "are not an RWKV-7 model's [vocab, width]")  # fmt: skip
case("single-shard", "export", "one safetensors shard instead of its folder",
     lambda e: ["export", e.copy(e.fla) / "model-00001-of-00002.safetensors", *_out(e)], "give the Hugging Face folder")  # fmt: skip
case("missing-path", "export", "a path that does not exist (and is no preset or repo)",
     lambda e: ["export", e.path("nothing/here.pth"), *_out(e)], "is neither a preset")  # fmt: skip
case("unknown-preset", "export", "an unknown preset", lambda e: ["export", "rwkv9-7b", *_out(e)], "'rwkv9-7b' is neither a preset")
case("spec-too-long", "export", "a model argument too long to be a path", lambda e: ["export", "x" * 5000, *_out(e)], "is neither a preset")

# === export: Hugging Face folders ===========================================================
case("folder-no-config", "export", "a folder without config.json", lambda e: ["export", e.write("d/readme.txt", "x").parent, *_out(e)],
     "not a Hugging Face model folder (no config.json)")  # fmt: skip
case("config-invalid-json", "export", "config.json that is not JSON",
     lambda e: ["export", (lambda f: (f / "config.json").write_text("{oops") and f)(e.copy(e.fla, "hf")), *_out(e)], "invalid JSON")  # fmt: skip
case("config-array", "export", "config.json holding an array", lambda e: ["export", e.folder(e.fla, _whole(lambda d: [d])), *_out(e)],
     "expected a JSON object")  # fmt: skip
case("config-non-utf8", "export", "config.json with bytes that are not UTF-8",
     lambda e: ["export", (lambda f: (f / "config.json").write_bytes(b'{"model_type": "\xff"}') and f)(e.copy(e.fla, "hf")), *_out(e)],
     "invalid JSON")  # fmt: skip
case("config-deeply-nested", "export", "config.json nested 100,000 deep",
     lambda e: ["export", (lambda f: (f / "config.json").write_text("[" * 100000 + "]" * 100000) and f)(e.copy(e.fla, "hf")), *_out(e)],
     "invalid JSON")  # fmt: skip
case("config-unknown-type", "export", "an architecture ssmport does not support",
     lambda e: ["export", e.folder(e.fla, lambda d: d.update(model_type="llama", architectures=["LlamaForCausalLM"])), *_out(e)],
     "model_type 'llama' is not supported")  # fmt: skip
case("config-disagrees", "export", "config.json that disagrees with the tensors",
     lambda e: ["export", e.folder(e.fla, _set("hidden_size", 256)), *_out(e)], "misshaped")  # fmt: skip
case("config-overflowing-number", "export", "config.json with a number beyond a double (1e400)",
     lambda e: ["export", (lambda f: (f / "config.json").write_text((f / "config.json").read_text().replace('"hidden_size": 128', '"hidden_size": 1e400')) and f)(e.copy(e.fla, "hf")), *_out(e)],
     "invalid JSON (the number 1e400 is beyond a 64-bit float)")  # fmt: skip
case("shard-truncated", "export", "a truncated safetensors shard",
     lambda e: ["export", (lambda f: (lambda s: s.write_bytes(s.read_bytes()[:-100]))(f / "model-00001-of-00002.safetensors") and f)(e.copy(e.fla, "hf")), *_out(e)],
     "not a readable safetensors file")  # fmt: skip
case("shard-missing", "export", "a shard the index lists is missing",
     lambda e: ["export", (lambda f: (f / "model-00002-of-00002.safetensors").unlink() or f)(e.copy(e.fla, "hf")), *_out(e)],
     "shard(s) listed in model.safetensors.index.json are missing")  # fmt: skip
case("shard-is-directory", "export", "a listed shard that is a directory",
     lambda e: ["export", (lambda f: ((f / "model-00002-of-00002.safetensors").unlink(), (f / "model-00002-of-00002.safetensors").mkdir()) and f)(e.copy(e.fla, "hf")), *_out(e)],
     "are missing")  # fmt: skip
case("index-not-json", "export", "a shard index that is not JSON",
     lambda e: ["export", (lambda f: (f / "model.safetensors.index.json").write_text("nope") and f)(e.copy(e.fla, "hf")), *_out(e)],
     "not a readable shard index")  # fmt: skip
case("index-no-weight-map", "export", "a shard index without weight_map", lambda e: ["export", _index_edit(e, _drop("weight_map")), *_out(e)],
     "no weight_map object naming the shards")  # fmt: skip
case("index-weight-map-list", "export", "a shard index whose weight_map is a list",
     lambda e: ["export", _index_edit(e, _set("weight_map", ["a.safetensors"])), *_out(e)], "no weight_map object")  # fmt: skip
case("index-weight-map-empty", "export", "a shard index with an empty weight_map",
     lambda e: ["export", _index_edit(e, _set("weight_map", {})), *_out(e)], "no weight_map object")  # fmt: skip
case("index-shard-number", "export", "a shard index naming a shard by a number",
     lambda e: ["export", _index_edit(e, lambda d: d["weight_map"].__setitem__("lm_head.weight", 7)), *_out(e)],
     "which is not a file name in this folder")  # fmt: skip
case("index-shard-escapes", "export", "a shard index naming `../` a file outside the folder",
     lambda e: ["export", _index_edit(e, lambda d: d["weight_map"].__setitem__("lm_head.weight", "../../etc/passwd")), *_out(e)],
     "which is not a file name in this folder")  # fmt: skip
case("index-shard-absolute", "export", "a shard index naming an absolute path",
     lambda e: ["export", _index_edit(e, lambda d: d["weight_map"].__setitem__("lm_head.weight", "/etc/hostname")), *_out(e)],
     "which is not a file name in this folder")  # fmt: skip
case("index-lists-absent-tensor", "export", "a shard index listing a tensor no shard holds",
     lambda e: ["export", _index_edit(e, lambda d: d["weight_map"].__setitem__("model.ghost.weight", "model-00001-of-00002.safetensors")), *_out(e)],
     "lists 1 tensor(s) no shard holds (model.ghost.weight)")  # fmt: skip
case("index-misses-tensor", "export", "a shard index that does not list a tensor the shards hold",
     lambda e: ["export", _index_edit(e, lambda d: d["weight_map"].pop("lm_head.weight")), *_out(e)],
     "does not list 1 tensor(s) the shards hold (lm_head.weight)")  # fmt: skip
case("no-weights", "export", "a folder with config.json and no weights",
     lambda e: ["export", (lambda f: [p.unlink() for p in f.glob("model*")] and f)(e.copy(e.fla, "hf")), *_out(e)], "no weights found")  # fmt: skip

# config.json values, in each architecture's own keys: each refused in one line naming the key
_ARCHES = {"rwkv7": ("fla", "num_hidden_layers", "norm_eps"), "mamba2": ("m2", "num_hidden_layers", "layer_norm_epsilon"),
           "gdn": ("gdn", "num_hidden_layers", "norm_eps")}  # fmt: skip
_VALUES = [  # (id, what, key: layers | eps | hidden | vocab, value, message)
    ("layers-1e9", "a layer count of 10^9 (nothing allocated for it)", "layers", 10**9, "is outside [1, 1024]"),
    ("layers-0", "a layer count of 0", "layers", 0, "is outside [1, 1024]"),
    ("layers-fraction", "a layer count of 2.5", "layers", 2.5, "is not a whole number"),
    ("layers-string", "a layer count written as a string", "layers", "2", "is not a whole number"),
    ("layers-bool", "a layer count of true", "layers", True, "is not a whole number"),
    ("hidden-0", "a width of 0", "hidden", 0, "hidden_size=0 is outside"),
    ("hidden-negative", "a negative width", "hidden", -128, "hidden_size=-128 is outside"),
    ("vocab-1e12", "a vocabulary of 10^12", "vocab", 10**12, "vocab_size=1000000000000 is outside"),
    ("eps-nan", "a NaN epsilon (not JSON: refused as the file's invalid JSON)", "eps", float("nan"), "invalid JSON (NaN is not a JSON number)"),
    ("eps-nan-object", "a NaN epsilon as transformers 5 writes it", "eps", {"__float__": "NaN"}, "is not a positive number"),
    ("eps-infinity", "an infinite epsilon (not JSON)", "eps", float("inf"), "invalid JSON (Infinity is not a JSON number)"),
    ("eps-zero", "an epsilon of 0", "eps", 0, "is not a positive number"),
    ("eps-negative", "a negative epsilon", "eps", -1e-5, "is not a positive number"),
    ("eps-string", "an epsilon written as a string", "eps", "1e-5", "is not a number"),
]
for arch, (folder, layers_key, eps_key) in _ARCHES.items():
    keys = {"layers": layers_key, "eps": eps_key, "hidden": "hidden_size", "vocab": "vocab_size"}
    for vid, what, key, value, message in _VALUES:
        case(f"{arch}-config-{vid}", "export", f"{arch} config.json: {what}",
             lambda e, folder=folder, k=keys[key], v=value: ["export", e.folder(getattr(e, folder), _set(k, v)), *_out(e)], message)
def _stray_fla(e: Env) -> Path:
    from safetensors.torch import save_file
    import torch

    f = e.copy(e.fla, "hf")
    save_file({"model.layers.99999999.attn.x_r": torch.zeros(1)}, str(f / "stray.safetensors"))
    e.edit_json(f / "model.safetensors.index.json",
                lambda d: d["weight_map"].__setitem__("model.layers.99999999.attn.x_r", "stray.safetensors"))  # fmt: skip
    return f


for arch, stray in (("rwkv7", _stray_fla), ("mamba2", lambda e: _add_tensor(e, e.m2, "backbone.layers.99999999.norm.weight")),
                    ("gdn", lambda e: _add_tensor(e, e.gdn, "model.layers.99999999.attn.A_log"))):  # fmt: skip
    case(f"{arch}-stray-layer", "export", f"{arch}: a stray tensor of layer 99999999 (nothing allocated for it)",
         lambda e, stray=stray: ["export", stray(e), *_out(e)], "config.json says 2 layers but the checkpoint holds 100000000")  # fmt: skip


def _no_head_dim(d):
    d.pop("head_dim")
    d["num_heads"] = 1000


_config_cases("rwkv7", "fla", (
    ("rwkv7-head-dim-0", "head_dim 0", _set("head_dim", 0), "head_dim=0 is outside"),
    ("rwkv7-head-dim-too-big", "head_dim larger than the width", _set("head_dim", 256), "do not divide into heads of head_dim=256"),
    ("rwkv7-heads-too-many", "more heads than channels", _no_head_dim, "hidden_size/num_heads=0.128 is not a whole number"),
    ("rwkv7-value-dim-string", "value_dim a string", _set("value_dim", "x"), "value_dim='x' is not a whole number"),
    ("rwkv7-value-dim-strings", "value_dim a list of strings", _set("value_dim", ["a", "a"]), "value_dim='a' is not a whole number"),
    ("rwkv7-value-dim-0", "value_dim 0", _set("value_dim", 0), "value_dim=0 is not a whole number in"),
    ("rwkv7-value-dim-per-layer", "value_dim differing per layer", _set("value_dim", [128, 64]), "per-layer value_dim"),
    ("rwkv7-lora-0", "a LoRA rank of 0", _set("decay_low_rank_dim", 0), "decay_low_rank_dim=0 is outside"),
    ("rwkv7-ratio-nan", "hidden_ratio NaN", lambda d: (d.pop("intermediate_size"), d.__setitem__("hidden_ratio", float("nan"))),
     "invalid JSON (NaN is not a JSON number)"),
    ("rwkv7-ratio-huge", "hidden_ratio 10^30", lambda d: (d.pop("intermediate_size"), d.__setitem__("hidden_ratio", 1e30)),
     "hidden_size*hidden_ratio="),
    ("rwkv7-hybrid", "hybrid attention layers", _set("attn", {"layers": [1]}), "hybrid attention layers ('attn') is not supported"),
    ("rwkv7-act", "another activation", _set("hidden_act", "gelu"), "hidden_act='gelu' is not supported"),
    ("rwkv7-norm-first-string", "norm_first written as a string", _set("norm_first", "false"), "norm_first='false' is not true or false"),
    ("rwkv7-tie-string", "tie_word_embeddings written as a string", _set("tie_word_embeddings", "no"), "tie_word_embeddings='no' is not true or false"),
    ("rwkv7-no-heads", "neither head_dim nor num_heads", _drop("head_dim"), "sets neither head_dim nor num_heads"),
))  # fmt: skip
_config_cases("mamba2", "m2", (
    ("mamba2-expand-mismatch", "expand that does not fit the heads (said in its own terms)", _set("expand", 4),
     "hidden_size x expand (64 x 4 = 256) must equal num_heads x head_dim (4 x 32 = 128)"),
    ("mamba2-expand-huge", "expand 10^30", _set("expand", 1e30), "must equal num_heads x head_dim"),
    ("mamba2-groups-0", "n_groups 0", _set("n_groups", 0), "n_groups=0 is outside"),
    ("mamba2-groups-uneven", "heads that do not divide into the groups", _set("n_groups", 3), "heads do not divide into 3 groups"),
    ("mamba2-kernel-huge", "a conv kernel of 10^9", _set("conv_kernel", 10**9), "conv_kernel=1000000000 is outside"),
    ("mamba2-kernel-1", "a conv kernel of 1", _set("conv_kernel", 1), "conv kernel 1 < 2 is not supported"),
    ("mamba2-dt-limit-nan", "a NaN time_step_limit", _set("time_step_limit", [0.0, float("nan")]), "invalid JSON (NaN is not a JSON number)"),
    ("mamba2-dt-limit-shape", "a time_step_limit of three numbers", _set("time_step_limit", [0, 1, 2]), "is not a pair of numbers"),
    ("mamba2-conv-bias-string", "use_conv_bias written as a string", _set("use_conv_bias", "false"), "use_conv_bias='false' is not true or false"),
    ("mamba2-norm-before-gate", "norm_before_gate (transformers and mamba_ssm disagree)", _set("norm_before_gate", True),
     "norm_before_gate=true is not supported"),
    ("mamba2-act", "another activation", _set("hidden_act", "relu"), "hidden_act='relu' is not supported"),
))  # fmt: skip
_config_cases("gdn", "gdn", (
    ("gdn-expand-v-huge", "expand_v 10^30", _set("expand_v", 1e30), "head_dim*expand_v=1.6e+31 is not a whole number"),
    ("gdn-expand-v-nan", "expand_v NaN", _set("expand_v", float("nan")), "invalid JSON (NaN is not a JSON number)"),
    ("gdn-expand-v-fraction", "an expand_v that makes a fractional head", _set("expand_v", 1.03), "gives a fractional value head size"),
    ("gdn-v-heads-0", "num_v_heads 0", _set("num_v_heads", 0), "num_v_heads=0 is outside"),
    ("gdn-v-heads-uneven", "num_v_heads not a multiple of num_heads", _set("num_v_heads", 3), "is not a multiple of num_heads"),
    ("gdn-conv-1", "conv_size 1", _set("conv_size", 1), "conv_size=1"),
    ("gdn-gate-string", "use_gate written as a string", _set("use_gate", "no"), "use_gate='no' is not true or false"),
    ("gdn-no-short-conv", "use_short_conv false", _set("use_short_conv", False), "use_short_conv=false is not supported"),
    ("gdn-ratio-huge", "hidden_ratio 10^30", lambda d: (d.__setitem__("hidden_ratio", 1e30)), "hidden_size*hidden_ratio="),
))  # fmt: skip

_config_cases("lfm2_moe", "moe", (
    ("moe-topk-over-experts", "num_experts_per_tok above num_experts", _set("num_experts_per_tok", 9),
     "num_experts_per_tok 9 is not in [1, num_experts=8]"),
    ("moe-topk-0", "num_experts_per_tok 0", _set("num_experts_per_tok", 0), "num_experts_per_tok=0 is outside [1, 4096]"),
    ("moe-experts-huge", "num_experts 10^9 (nothing allocated for it)", _set("num_experts", 10**9), "num_experts"),
    ("moe-norm-topk-string", "norm_topk_prob written as a string", _set("norm_topk_prob", "yes"),
     "norm_topk_prob='yes' is not true or false"),
    ("moe-scaling-negative", "a negative routed_scaling_factor", _set("routed_scaling_factor", -1.0), "routed_scaling_factor"),
    ("moe-expert-bias-string", "use_expert_bias written as a string", _set("use_expert_bias", "no"),
     "use_expert_bias='no' is not true or false"),
))  # fmt: skip
_config_cases("nemotron_h MoE", "nemotron_moe", (
    ("nemotron-moe-topk-over-experts", "num_experts_per_tok above n_routed_experts", _set("num_experts_per_tok", 13),
     "num_experts_per_tok 13 is not in [1, num_experts=12]"),
    ("nemotron-moe-groups-uneven", "n_group not dividing the experts", _set("n_group", 5), "n_group 5 does not split 12 experts"),
    ("nemotron-moe-groups-of-one", "n_group as many as the experts", _set("n_group", 12), "n_group 12 does not split 12 experts"),
    ("nemotron-moe-topk-group-over", "topk_group above n_group", _set("topk_group", 4), "topk_group 4 is not in [1, n_group=3]"),
    ("nemotron-moe-topk-group-0", "topk_group 0", _set("topk_group", 0), "topk_group=0 is outside"),
    ("nemotron-moe-groups-too-few", "topk_group groups too small to hold top-k", lambda d: d.update(topk_group=1, num_experts_per_tok=5),
     "topk_group 1 of 3 groups of 4 cannot hold 5 experts"),
    ("nemotron-moe-scoring", "an unknown scoring function (scoring_func softmax)", _set("scoring_func", "softmax"),
     "scoring_func='softmax' (Nemotron-H's router scores by sigmoid)"),
    ("nemotron-moe-scaling-0", "routed_scaling_factor 0", _set("routed_scaling_factor", 0), "routed_scaling_factor=0.0 is not a positive number"),
    ("nemotron-moe-experts-huge", "n_routed_experts 10^9", _set("n_routed_experts", 10**9), "n_routed_experts=1000000000 is outside"),
    ("nemotron-moe-shared-2", "two shared experts", _set("n_shared_experts", 2), "n_shared_experts=2"),
))  # fmt: skip


def _lfm3_rope(full: dict | str, sliding: dict | None = None, **more) -> Callable[[dict], None]:
    """rope_parameters per layer kind: `full` for full_attention (or the whole value when a
    string), `sliding` for sliding_attention (its default type when None)."""
    value = full if isinstance(full, str) else {"full_attention": full, "sliding_attention": sliding or {"rope_type": "default"}, **more}
    return _set("rope_parameters", value)


_LAYERS6 = ["conv", "sliding_attention", "full_attention", "conv", "sliding_attention", "conv"]
_config_cases("lfm3", "lfm3", (
    ("lfm3-window-0", "sliding_window 0", _set("sliding_window", 0), "sliding_window=0 is outside"),
    ("lfm3-window-negative", "a negative sliding_window", _set("sliding_window", -4), "sliding_window=-4 is outside"),
    ("lfm3-window-float", "a fractional sliding_window", _set("sliding_window", 8.5), "sliding_window=8.5 is not a whole number"),
    ("lfm3-window-string", "sliding_window written as a string", _set("sliding_window", "8"), "sliding_window='8' is not a whole number"),
    ("lfm3-window-bool", "sliding_window true", _set("sliding_window", True), "sliding_window=True is not a whole number"),
    ("lfm3-window-huge", "sliding_window 10^9", _set("sliding_window", 10**9), "sliding_window=1000000000 is above 131072 positions"),
    ("lfm3-window-ring-too-big", "sliding_window 2^20 (a ring of a million rows, whatever --context)",
     lambda d: d.update(sliding_window=1 << 20, max_position_embeddings=1 << 21), "sliding_window=1048576 is above 131072 positions"),
    ("lfm3-window-over-positions", "sliding_window above max_position_embeddings", _set("sliding_window", 9000),
     "sliding_window 9000 is not in [1, max_position_embeddings]"),
    ("lfm3-window-null", "sliding_window null with sliding layers", _set("sliding_window", None), "sliding_window=null"),
    ("lfm3-layer-kind-unknown", "an unknown layer kind", _set("layer_types", ["conv", "mamba2", *_LAYERS6[2:]]),
     "layer kind(s) 'mamba2' in layer_types"),
    ("lfm3-layer-kind-legacy", "a kind another family spells so (mamba)", _set("layer_types", ["conv", "mamba", *_LAYERS6[2:]]),
     "layer kind(s) 'mamba' in layer_types"),
    ("lfm3-layer-types-short", "fewer layer_types than layers", _set("layer_types", _LAYERS6[:2]), "has 2 layer_types for num_hidden_layers=6"),
    ("lfm3-layer-types-string", "layer_types a string", _set("layer_types", "conv"), "layer_types='conv' is not a list of layer kinds"),
    ("lfm3-layer-types-numbers", "layer_types numbers", _set("layer_types", [1, 2, 3, 4, 5, 6]), "is not a list of layer kinds"),
    ("lfm3-rope-string", "rope_parameters a string", _lfm3_rope("x"), "rope_parameters='x' is not an object"),
    ("lfm3-rope-kind-missing", "rope_parameters without the sliding layers' set", _set("rope_parameters", {"full_attention": {}}),
     "rope_parameters has no object for 'sliding_attention'"),
    ("lfm3-rope-kind-unknown", "rope_parameters for a layer kind LFM3 lacks (read as one flat set before)",
     _lfm3_rope({"rope_type": "default"}, chunked_attention={"rope_theta": 1.0}), "rope_parameters for layer kind(s) 'chunked_attention'"),
    ("lfm3-rope-type", "a rescaled RoPE (yarn) on the full layers", _lfm3_rope({"rope_type": "yarn", "factor": 4.0}),
     "rope_type 'yarn' on full_attention layers"),
    ("lfm3-rope-theta-0", "rope_theta 0 on the sliding layers", _lfm3_rope({}, {"rope_type": "default", "rope_theta": 0}),
     "rope_theta=0.0 is not a positive number"),
    ("lfm3-rope-theta-string", "rope_theta written as a string", _lfm3_rope({"rope_theta": "1e6"}), "rope_theta='1e6' is not a number"),
    ("lfm3-rope-fraction-2", "partial_rotary_factor 2", _lfm3_rope({"rope_type": "proportional", "partial_rotary_factor": 2}),
     "partial_rotary_factor=2.0 is not in [0, 1]"),
    ("lfm3-rope-fraction-negative", "a negative partial_rotary_factor", _lfm3_rope({"rope_type": "proportional", "partial_rotary_factor": -0.5}),
     "partial_rotary_factor=-0.5 is not in [0, 1]"),
    ("lfm3-rope-factor", "a rope factor (scaled positions)", _lfm3_rope({"rope_type": "default", "factor": 4.0}), "a rope factor 4.0"),
    ("lfm3-conv-1", "conv_L_cache 1", _set("conv_L_cache", 1), "conv_L_cache 1 < 2 is not supported"),
    ("lfm3-conv-0", "conv_L_cache 0", _set("conv_L_cache", 0), "conv_L_cache=0 is outside"),
    ("lfm3-conv-huge", "conv_L_cache 10^9", _set("conv_L_cache", 10**9), "conv_L_cache=1000000000 is outside"),
    ("lfm3-conv-float", "a fractional conv_L_cache", _set("conv_L_cache", 2.5), "conv_L_cache=2.5 is not a whole number"),
    ("lfm3-conv-other", "a conv_L_cache the weights do not have", _set("conv_L_cache", 5), "conv.conv.weight [48, 1, 3]"),
    ("lfm3-gate-string", "use_attention_gate written as a string", _set("use_attention_gate", "yes"), "use_attention_gate='yes' is not true or false"),
    ("lfm3-head-dim-odd", "an odd head_dim", _set("head_dim", 15), "head_dim 15 is odd"),
))  # fmt: skip



def _with_template(e: Env, template: str) -> Path:
    """A copy of the LFM3 folder whose tokenizer_config.json carries `template`."""
    f = e.folder(e.lfm3)
    e.edit_json(f / "tokenizer_config.json", lambda d: d.update(chat_template=template))
    return f


for cid, what, template, message in (
    ("include", "an {% include %}", "{% include 'other.jinja' %}", "the chat template does not render (TypeError"),
    ("huge-range", "a loop over range(10^10)", "{% for i in range(10000000000) %}{% endfor %}", "the chat template does not render (OverflowError"),
    ("huge-repeat", "'x' * 4e9", "{{ 'x' * 4000000000 }}", "is too large"),
    ("recursion", "a macro calling itself", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "(RecursionError"),
    ("syntax", "a syntax error", "{% for m in messages %}", "the chat template does not render (TemplateSyntaxError"),
):  # fmt: skip
    case(f"export-chat-template-{cid}", "export", f"a checkpoint whose chat template cannot render: {what} (exported before; only `chat` refused it)",
         lambda e, template=template: ["export", _with_template(e, template), *_out(e)], message)  # fmt: skip

_config_cases("recurrent_gemma", "rgemma", (
    ("rgemma-window-0", "attention_window_size 0", _set("attention_window_size", 0), "attention_window_size=0 is outside"),
    ("rgemma-window-negative", "a negative attention_window_size", _set("attention_window_size", -1), "attention_window_size=-1 is outside"),
    ("rgemma-window-float", "a fractional attention_window_size", _set("attention_window_size", 8.5), "attention_window_size=8.5 is not a whole number"),
    ("rgemma-window-string", "attention_window_size written as a string", _set("attention_window_size", "8"),
     "attention_window_size='8' is not a whole number"),
    ("rgemma-window-bool", "attention_window_size true", _set("attention_window_size", True), "attention_window_size=True is not a whole number"),
    ("rgemma-window-huge", "attention_window_size 2^20 (a ring of a million rows; exported before)", _set("attention_window_size", 1 << 20),
     "attention_window_size=1048576 is above 131072 positions"),
    ("rgemma-sliding-window-0", "sliding_window 0 (transformers' other name for it)", lambda d: (d.pop("attention_window_size"), d.update(sliding_window=0)),
     "sliding_window=0 is outside"),
    ("rgemma-windows-disagree", "attention_window_size and sliding_window disagreeing (one was ignored before)", _set("sliding_window", 16),
     "attention_window_size=8 and sliding_window=16"),
    ("rgemma-block-unknown", "an unknown block type", _set("block_types", ["recurrent", "mlp"]), "block_types=['recurrent', 'mlp']"),
    ("rgemma-block-empty", "no block types", _set("block_types", []), "block_types=[]"),
    ("rgemma-block-string", "block_types a string", _set("block_types", "recurrent"), "block_types='recurrent'"),
    ("rgemma-block-attention-only", "no recurrent block", _set("block_types", ["attention"]), "no recurrent layer"),
    ("rgemma-block-wrong", "block types the weights do not have", _set("block_types", ["recurrent"]), "does not match RecurrentGemma"),
    ("rgemma-soft-cap-0", "logits_soft_cap 0", _set("logits_soft_cap", 0), "logits_soft_cap=0.0 is not a positive number"),
    ("rgemma-soft-cap-negative", "a negative logits_soft_cap", _set("logits_soft_cap", -30), "logits_soft_cap=-30.0 is not a positive number"),
    ("rgemma-soft-cap-string", "logits_soft_cap written as a string", _set("logits_soft_cap", "30"), "logits_soft_cap='30' is not a number"),
    ("rgemma-conv-1", "conv1d_width 1", _set("conv1d_width", 1), "conv1d_width=1 (at least 2 taps)"),
    ("rgemma-conv-huge", "conv1d_width 10^9", _set("conv1d_width", 10**9), "conv1d_width=1000000000 is outside"),
    ("rgemma-lru-uneven", "lru_width not a multiple of the heads", _set("lru_width", 7), "lru_width=7 not a multiple of num_attention_heads=4"),
    ("rgemma-rotary-above-1", "partial_rotary_factor 5", _set("rope_parameters", {"rope_type": "default", "partial_rotary_factor": 5}),
     "partial_rotary_factor=5.0 (above 1)"),
    ("rgemma-rope-type", "a rescaled RoPE", _set("rope_parameters", {"rope_type": "linear", "factor": 2.0}), "rope_type 'linear'"),
    ("rgemma-act", "another activation", _set("hidden_activation", "relu"), "hidden_activation 'relu'"),
    ("rgemma-kv-heads-uneven", "heads not a multiple of the kv heads", _set("num_key_value_heads", 3), "not a multiple of num_key_value_heads=3"),
))  # fmt: skip


def _rwkv6_edit(e: Env, edit: Callable[[dict], None]) -> Path:
    import torch

    sd = torch.load(e.rwkv6_pth, weights_only=True)
    edit(sd)
    torch.save(sd, e.path("x060.pth"))
    return e.path("x060.pth")


case("rwkv6-missing-key", "export", "an RWKV-6 .pth with a tensor missing",
     lambda e: ["export", _rwkv6_edit(e, lambda sd: sd.pop("blocks.1.att.time_faaaa")), *_out(e)],
     "missing 1: blocks.1.att.time_faaaa")  # fmt: skip
case("rwkv6-misshaped", "export", "an RWKV-6 .pth with a tensor of the wrong shape",
     lambda e: ["export", _rwkv6_edit(e, lambda sd: sd.__setitem__("blocks.0.att.time_decay_w1", sd["blocks.0.att.time_decay_w1"][:, :8])),
                *_out(e)],
     "misshaped")  # fmt: skip
case("int4-state-dtype", "export", "--quant int4keepproj with a state dtype that is not one",
     lambda e: ["export", e.pth, "--quant", "int4keepproj", "--state-dtype", "int4", *_out(e)], "invalid choice: 'int4'")  # fmt: skip
case("int4-recipe-case", "export", "a recipe name in capitals (`INT4`)",
     lambda e: ["export", e.pth, "--quant", "INT4", *_out(e)], "invalid choice: 'INT4'")  # fmt: skip

# === export: options =======================================================================
case("experts-unknown", "export", "an unknown --experts form", lambda e: ["export", e.pth, "--experts", "inplace", *_out(e)],
     "invalid choice: 'inplace'")  # fmt: skip
case("experts-branched-dense", "export", "--experts branched for a model without routed experts",
     lambda e: ["export", e.pth, "--quant", "fp32", "--experts", "branched", *_out(e)],
     "--experts branched needs routed experts stored in float (fp32 or fp16): this model has no routed experts")  # fmt: skip
case("experts-branched-int8", "export", "--experts branched with a recipe that stores the experts as integers",
     lambda e: ["export", e.moe, "--quant", "int8", "--experts", "branched", "--no-gate", *_out(e)],
     "this recipe stores them as integers")  # fmt: skip
case("layout-unknown", "export", "an unknown --layout", lambda e: ["export", e.pth, "--layout", "android", *_out(e)],
     "invalid choice: 'android'")  # fmt: skip
case("apple-main-without-apple-layout", "export", "--apple-main without --layout apple",
     lambda e: ["export", e.pth, "--apple-main", "chunk", *_out(e)], "--apple-main applies to --layout apple only")  # fmt: skip
case("context-without-kv-cache", "export", "--context for a model with no KV cache",
     lambda e: ["export", e.pth, "--context", "128", *_out(e)], "--context sizes a KV cache, and rwkv7 has none")  # fmt: skip
case("apple-context-below-chunk", "export", "--layout apple with a --context smaller than the prefill chunk",
     lambda e: ["export", "qwen3.5-tiny", "--synthetic", "--layout", "apple", "--context", "8", *_out(e)], "--context 8")  # fmt: skip
case("context-below-gate-steps", "export", "--context smaller than the export gate's --gate-steps",
     lambda e: ["export", "qwen3.5-tiny", "--synthetic", "--context", "4", "--gate-steps", "8", "-o", e.path("out"), "-q"],
     "--context 4 holds fewer positions than the export gate's 8 tokens")  # fmt: skip
case("context-zero", "export", "--context 0", lambda e: ["export", "qwen3.5-tiny", "--synthetic", "--context", "0", *_out(e)],
     "--context 0: give a whole number of positions")  # fmt: skip
case("context-huge", "export", "--context of 2^40 positions",
     lambda e: ["export", "lfm2-tiny", "--synthetic", "--context", str(2**40), *_out(e)], "give a whole number of positions in [1,")  # fmt: skip
case("context-beyond-training", "export", "--context beyond the model's max_position_embeddings",
     lambda e: ["export", "qwen3.5-tiny", "--synthetic", "--context", "257", *_out(e)],
     "--context 257 is beyond the model's max_position_embeddings (256)")  # fmt: skip
case("quant-unknown", "export", "an unknown --quant", lambda e: ["export", e.pth, "--quant", "int3", *_out(e)], "invalid choice: 'int3'")
case("state-dtype-unknown", "export", "an unknown --state-dtype", lambda e: ["export", e.pth, "--state-dtype", "fp8", *_out(e)],
     "invalid choice: 'fp8'")  # fmt: skip
case("weights-and-synthetic", "export", "--weights with --synthetic",
     lambda e: ["export", "rwkv7-tiny", "--weights", e.pth, "--synthetic", *_out(e)], "not both")  # fmt: skip
case("weights-missing", "export", "--weights that does not exist", lambda e: ["export", "rwkv7-0.1b", "--weights", e.path("no.pth"), *_out(e)],
     "no such file or directory")  # fmt: skip
case("weights-wrong-preset", "export", "--weights of another size than the preset",
     lambda e: ["export", "rwkv7-0.1b", "--weights", e.pth, *_out(e)], "does not match preset rwkv7-0.1b")  # fmt: skip
case("weights-with-path", "export", "--weights with a checkpoint path", lambda e: ["export", e.pth, "--weights", e.pth, *_out(e)],
     "--weights goes with a preset name")  # fmt: skip
case("file-with-preset", "export", "--file with a preset", lambda e: ["export", "rwkv7-tiny", "--file", "x.pth", *_out(e)],
     "--file goes with a Hub repo name")  # fmt: skip
case("synthetic-with-path", "export", "--synthetic with a checkpoint path", lambda e: ["export", e.pth, "--synthetic", *_out(e)],
     "--synthetic needs a preset name")  # fmt: skip
case("seed-negative", "export", "a negative --seed", lambda e: ["export", "rwkv7-tiny", "--synthetic", "--seed", "-1", *_out(e)],
     "--seed must be at least 0 (got -1)")  # fmt: skip
case("seed-huge", "export", "a --seed of 2^40", lambda e: ["export", "rwkv7-tiny", "--seed", str(2**40), *_out(e)], "--seed must be at most")
case("seed-text", "export", "a --seed that is not a number", lambda e: ["export", "rwkv7-tiny", "--seed", "nan", *_out(e)],
     "argument --seed: invalid int value: 'nan'")  # fmt: skip
case("export-gate-steps-0", "export", "--gate-steps 0", lambda e: ["export", e.pth, "--gate-steps", "0", "-o", e.path("out"), "-q"],
     "--gate-steps must be at least 1")  # fmt: skip
case("export-gate-steps-huge", "export", "--gate-steps 10^9 (nothing allocated for it)",
     lambda e: ["export", e.pth, "--gate-steps", str(10**9), "-o", e.path("out"), "-q"], "--gate-steps must be at most 100,000")  # fmt: skip
case("export-gate-prefill-no-gate", "export", "--gate-prefill with --no-gate",
     lambda e: ["export", e.pth, "--gate-prefill", "--no-gate", *_out(e)], "--gate-prefill needs the export gate; drop --no-gate")  # fmt: skip
case("export-gate-prefill-no-prefill", "export", "--gate-prefill with --no-prefill",
     lambda e: ["export", e.pth, "--gate-prefill", "--no-prefill", "-o", e.path("out"), "-q"],
     "--gate-prefill needs the prefill function; drop --no-prefill")  # fmt: skip
case("prefill-chunk-0", "export", "--prefill-chunk 0", lambda e: ["export", e.pth, "--prefill-chunk", "0", *_out(e)],
     "--prefill-chunk must be between 1 and 4096 tokens (got 0)")  # fmt: skip
case("prefill-chunk-negative", "export", "a negative --prefill-chunk", lambda e: ["export", e.pth, "--prefill-chunk", "-8", *_out(e)],
     "--prefill-chunk must be between 1 and 4096")  # fmt: skip
case("prefill-chunk-huge", "export", "--prefill-chunk 10^8 (nothing allocated for it)",
     lambda e: ["export", e.pth, "--prefill-chunk", str(10**8), *_out(e)], "(got 100,000,000), or pass --no-prefill")  # fmt: skip
case("vocab-missing", "export", "--vocab that does not exist", lambda e: ["export", e.pth, "--vocab", e.path("v.txt"), *_out(e)],
     "no such file")  # fmt: skip
case("vocab-directory", "export", "--vocab that is a directory", lambda e: ["export", e.pth, "--vocab", e.tmp, *_out(e)],
     "a directory, not a vocab file")  # fmt: skip
case("vocab-malformed", "export", "--vocab that is not a vocab", lambda e: ["export", e.pth, "--vocab", e.write("v.txt", "hello\n"), *_out(e)],
     "unrecognized vocab format")  # fmt: skip
case("vocab-too-big", "export", "--vocab with ids beyond the embedding",
     lambda e: ["export", e.pth, "--vocab", e.write("v.txt", "1 'a' 1\n500 'b' 1\n"), *_out(e)], "beyond the model's 320-row embedding")  # fmt: skip
case("vocab-non-utf8", "export", "--vocab with bytes that are not UTF-8",
     lambda e: ["export", e.pth, "--vocab", e.write("v.txt", b"1 'a' 1\n2 '\xff' 1\n"), *_out(e)], "line is not valid UTF-8")  # fmt: skip
for vid, value, message in (("0", "0", "--verify must be between 2 and 64 tokens (got 0)"),
                             ("1", "1", "--verify must be between 2 and 64 tokens (got 1)"),
                             ("negative", "-4", "--verify must be between 2 and 64 tokens (got -4)"),
                             ("huge", str(10**9), "--verify must be between 2 and 64 tokens (got 1,000,000,000)"),
                             ("float", "2.5", "argument --verify: invalid int value: '2.5'"),
                             ("text", "eight", "argument --verify: invalid int value: 'eight'")):  # fmt: skip
    case(f"verify-{vid}", "export", f"--verify {value}", lambda e, value=value: ["export", e.pth, f"--verify={value}", *_out(e)], message)
for lid, layout in (("", "ssmport"), ("-apple", "apple")):
    case(f"verify-beyond-context{lid}", "export", f"--verify larger than the KV cache's --context (--layout {layout})",
         lambda e, layout=layout: ["export", "qwen3.5-tiny", "--synthetic", "--layout", layout, "--context", "16", "--verify", "32", *_out(e)],
         "--verify 32: the KV cache holds 16 positions (--context)")  # fmt: skip
case("quant-auto-without-budget", "export", "--quant auto without --size-budget",
     lambda e: ["export", e.pth, "--quant", "auto", *_out(e)], "--quant auto needs --size-budget SIZE")  # fmt: skip
case("size-budget-without-auto", "export", "--size-budget without --quant auto",
     lambda e: ["export", e.pth, "--quant", "int8", "--size-budget", "1MB", *_out(e)], "--size-budget applies to --quant auto only")  # fmt: skip
case("int8-tied-table-without-int8-head", "export", "--int8-tied-table with a recipe whose LM head is not int8",
     lambda e: ["export", e.pth, "--quant", "fp16", "--int8-tied-table", *_out(e)],
     "--int8-tied-table reads a tied table from an int8 LM head, which --quant fp16 does not store")  # fmt: skip
case("int8-tied-table-untied", "export", "--int8-tied-table on a model whose LM head is not tied to its embedding",
     lambda e: ["export", e.pth, "--quant", "int8keepproj", "--int8-tied-table", *_out(e)],
     "--int8-tied-table: rwkv7-tiny-fp32's LM head is not its embedding table (an untied head)")  # fmt: skip
for bid, value, message in (("0", "0", "--size-budget '0' is not a size"), ("negative", "-1MB", "--size-budget '-1MB' is not a size"),
                            ("garbage", "lots", "--size-budget 'lots' is not a size"),
                            ("unit", "3TB", "--size-budget '3TB' is not a size"),
                            ("too-small", "1KB", "--size-budget 1,024 bytes is below the smallest")):  # fmt: skip
    case(f"size-budget-{bid}", "export", f"--quant auto --size-budget {value}",
         lambda e, value=value: ["export", e.pth, "--quant", "auto", f"--size-budget={value}", *_out(e)], message)  # fmt: skip

# === export: where the bundle goes ==========================================================
case("out-exists", "export", "the bundle exists already",
     lambda e: ["export", e.pth, "--quant", "fp32", "-o", e.write("out/rwkv7-tiny-fp32-fp32/x", "keep").parents[1], "-q", "--no-gate"],
     "already exists (pass --overwrite to replace it)")  # fmt: skip
case("out-is-file", "export", "-o is a file", lambda e: ["export", e.pth, "-o", e.write("file", "x"), "-q"], "is not a directory")
case("out-under-file", "export", "-o inside a file", lambda e: ["export", e.pth, "-o", e.write("file", "x") / "sub", "-q"], "is not a directory")
case("out-proc", "export", "-o where nothing can be created", lambda e: ["export", e.pth, "-o", "/proc/ssmport-out", "-q"], "cannot write there")
case("out-immutable", "export", "-o a folder nothing can be written to",
     lambda e: ["export", e.pth, "-o", e.immutable(e.write("ro/keep", "x").parent), "-q"], "cannot write there")  # fmt: skip
case("out-too-long", "export", "-o a path longer than the system allows", lambda e: ["export", e.pth, "-o", e.path("d" * 300), "-q"],
     "File name too long")  # fmt: skip
for nid, name, message in (("dotdot", "..", "must be a single folder name"), ("escape", "../../x", "must be a single folder name"),
                           ("dot", ".", "must be a single folder name"), ("slash", "a/b", "must be a single folder name"),
                           ("empty", "", "must be a single folder name"), ("long", "n" * 240, "the limit is 200")):  # fmt: skip
    case(f"name-{nid}", "export", f"--name {name[:12]!r}{'...' if len(name) > 12 else ''} (a name must stay inside -o)",
         lambda e, name=name: ["export", e.pth, "-o", e.path("out"), "--name", name, "-q"], message)  # fmt: skip
case("overwrite-user-folder", "export", "--overwrite onto a folder that is not a bundle",
     lambda e: ["export", e.pth, "-o", e.write("out/mine/notes.txt", "precious").parents[1], "--name", "mine", "--overwrite", "-q"],
     "is not an ssmport bundle (no manifest.json saying so)")  # fmt: skip
case("overwrite-file", "export", "--overwrite onto a plain file",
     lambda e: ["export", e.pth, "-o", e.write("out/mine", "precious").parent, "--name", "mine", "--overwrite", "-q"],
     "is a file, not an ssmport bundle")  # fmt: skip
case("overwrite-the-checkpoint", "export", "--overwrite onto the checkpoint being exported",
     lambda e: ["export", e.copy(e.pth, "model.pth"), "-o", e.tmp, "--name", "model.pth", "--overwrite", "-q"], "is a file, not an ssmport bundle")  # fmt: skip
case("overwrite-symlink", "export", "--overwrite onto a symbolic link (to a bundle)",
     lambda e: ["export", e.pth, "-o", e.tmp, "--name", "link", "--overwrite", "-q"] if e.path("link").symlink_to(e.tok) is None else [],
     "is a symbolic link")  # fmt: skip
case("overwrite-foreign-manifest", "export", "--overwrite onto a folder whose manifest.json is not ssmport's",
     lambda e: ["export", e.pth, "-o", e.write("out/app/manifest.json", '{"name": "my app"}').parents[1], "--name", "app", "--overwrite", "-q"],
     "is not an ssmport bundle")  # fmt: skip
case("overwrite-bundle-with-user-files", "export", "--overwrite onto a bundle that holds the user's own files",
     lambda e: ["export", e.pth, "-o", e.tmp, "--name", "b", "--overwrite", "-q"] if e.bundle() and e.write("b/my-notes.txt", "x") else [],
     "holds files an export did not write (my-notes.txt)")  # fmt: skip

case("overwrite-bundle-with-user-files-inside", "export", "--overwrite onto a bundle with the user's file in tokenizer/ (or model.aimodel/)",
     lambda e: ["export", e.pth, "-o", e.tmp, "--name", "b", "--overwrite", "-q"] if e.bundle() and e.write("b/tokenizer/my-notes.txt", "x") else [],
     "holds files an export did not write (tokenizer/my-notes.txt)")  # fmt: skip


def _planted_link(e: Env, entry: str) -> Path:
    """A copy of `tok` whose `entry` is a link to a file of the user's outside it (see
    tests/test_hostile_bundles.py for every entry, link kind and command)."""
    b = e.bundle()
    target = e.write("home/.bashrc", "the user's file")
    (b / entry).unlink(missing_ok=True)
    (b / entry).symlink_to(target)
    return b


case("hostile-gate-link", "gate", "a bundle whose gate.json is a link to a file outside it", lambda e: ["gate", _planted_link(e, "gate.json")],
     "gate.json is a symbolic link inside the bundle")  # fmt: skip


def _planted_fifo(e: Env, entry: str) -> Path:
    b = e.bundle()
    (b / entry).unlink()
    os.mkfifo(b / entry)
    return b


case("hostile-vocab-fifo", "generate", "a bundle whose tokenizer/vocab.tsv is a named pipe",
     lambda e: ["generate", _planted_fifo(e, "tokenizer/vocab.tsv"), "--prompt", "hi"],
     "vocab.tsv is a named pipe inside the bundle")  # fmt: skip


def _checkpoint_inside_target(e: Env) -> list:
    b = e.bundle(name="target")
    shutil.rmtree(b / "tokenizer")
    e.edit_json(b / "manifest.json", _set("tokenizer", None))
    ckpt = shutil.copy(e.pth, b / "model.aimodel" / "source.pth")
    return ["export", ckpt, "-o", e.tmp, "--name", "target", "--overwrite", "-q"]


case("overwrite-folder-holding-source", "export", "--overwrite onto the bundle folder that holds the source checkpoint",
     _checkpoint_inside_target, "which this export reads; --overwrite will not replace it")  # fmt: skip


def _locked(e: Env) -> list:
    from ssmport.files import PathLock

    out = e.path("out")
    out.mkdir()
    lock = PathLock(out / ".rwkv7-tiny-fp32-fp32.lock")
    assert lock.acquire()
    e.setup_done.append(lock.release)
    return ["export", e.pth, "--quant", "fp32", "-o", out, "-q"]


case("export-concurrent", "export", "another export writing the same bundle right now", _locked, "another ssmport export is writing")

# === gate ===================================================================================
case("gate-missing-bundle", "gate", "a bundle that does not exist", lambda e: ["gate", e.path("none")], "not a bundle directory")
case("gate-bundle-is-file", "gate", "a file given as the bundle", lambda e: ["gate", e.write("f", "x")], "not a bundle directory")
case("gate-no-manifest", "gate", "a folder without manifest.json", lambda e: ["gate", e.write("d/x", "x").parent], "not an ssmport bundle (no manifest.json)")
case("gate-manifest-corrupt", "gate", "a manifest.json that is not JSON",
     lambda e: ["gate", (lambda b: (b / "manifest.json").write_text('{"format": ') and b)(e.bundle())], "unreadable manifest")  # fmt: skip
case("gate-prompts-0", "gate", "--prompts 0", lambda e: ["gate", e.tok, "--prompts", "0"], "--prompts must be at least 1 (got 0)")
case("gate-prompts-negative", "gate", "a negative --prompts", lambda e: ["gate", e.tok, "--prompts", "-3"], "--prompts must be at least 1")
case("gate-steps-0", "gate", "--steps 0", lambda e: ["gate", e.tok, "--steps", "0"], "--steps must be at least 1 (got 0)")
case("gate-steps-huge", "gate", "--steps 10^9 (nothing allocated for it)", lambda e: ["gate", e.tok, "--steps", str(10**9)],
     "--steps must be at most 100,000")  # fmt: skip
case("gate-decode-only-compare", "gate", "--decode-only with --compare", lambda e: ["gate", e.tok, "--decode-only", "--compare"],
     "--decode-only applies to the bundle's own gate, not to --compare")  # fmt: skip
case("gate-product-huge", "gate", "--prompts x --steps beyond the limit", lambda e: ["gate", e.tok, "--prompts", "1000", "--steps", "1000"],
     "--prompts x --steps is 1,000,000 teacher-forced steps")  # fmt: skip
case("gate-steps-text", "gate", "--steps that is not a number", lambda e: ["gate", e.tok, "--steps", "many"], "invalid int value: 'many'")
case("gate-tokens-missing", "gate", "--tokens-file that does not exist", lambda e: ["gate", e.tok, "--tokens-file", e.path("t")],
     "cannot read (No such file or directory)")  # fmt: skip
case("gate-tokens-dir", "gate", "--tokens-file that is a directory", lambda e: ["gate", e.tok, "--tokens-file", e.tmp], "cannot read (Is a directory)")
case("gate-tokens-non-utf8", "gate", "--tokens-file with bytes that are not UTF-8", lambda e: ["gate", e.tok, "--tokens-file", e.write("t", b"1,2,\xff")],
     "not valid UTF-8 text (byte 4)")  # fmt: skip
case("gate-tokens-not-ints", "gate", "--tokens-file with a word in it", lambda e: ["gate", e.tok, "--tokens-file", e.write("t", "1, 2, x3")],
     "'x3' is not an integer token id")  # fmt: skip
case("gate-tokens-out-of-range", "gate", "--tokens-file with ids outside the vocabulary",
     lambda e: ["gate", e.tok, "--tokens-file", e.write("t", "1 320")], "outside the vocabulary [0, 320)")  # fmt: skip
case("gate-tokens-endless", "gate", "--tokens-file /dev/zero (read up to a bound, not forever)",
     lambda e: ["gate", e.tok, "--tokens-file", "/dev/zero"], "larger than 256 MB")  # fmt: skip
case("gate-tokens-empty", "gate", "an empty --tokens-file", lambda e: ["gate", e.tok, "--tokens-file", e.write("t", "")], "no token ids given")
case("gate-text-no-tokenizer", "gate", "--text for a bundle without a tokenizer", lambda e: ["gate", e.plain, "--text", "hi"],
     "has no tokenizer, so --text cannot be used")  # fmt: skip
case("gate-text-file-missing", "gate", "--text-file that does not exist", lambda e: ["gate", e.tok, "--text-file", e.path("t")],
     "cannot read (No such file or directory)")  # fmt: skip
case("gate-text-file-non-utf8", "gate", "--text-file with bytes that are not UTF-8",
     lambda e: ["gate", e.tok, "--text-file", e.write("t", b"caf\xe9")], "not valid UTF-8 text (byte 3)")  # fmt: skip
case("gate-weights-missing", "gate", "--weights that does not exist", lambda e: ["gate", e.tok, "--weights", e.path("w.pth")],
     "no such file or directory")  # fmt: skip
case("gate-weights-other-architecture", "gate", "--weights of another architecture", lambda e: ["gate", e.tok, "--weights", e.m2],
     "is a mamba2 model, but the bundle is rwkv7")  # fmt: skip
case("gate-weights-other-size", "gate", "--weights of another size", lambda e: ["gate", e.tok, "--weights", e.small_pth],
     "is not the model this bundle was exported from: hidden_size=64 (bundle 128)")  # fmt: skip
case("gate-weights-other-weights", "gate", "--weights of the same shapes but other weights",
     lambda e: ["gate", e.tok, "--weights", e.other_pth], "holds other values (same shapes, other weights)")  # fmt: skip
case("gate-source-gone", "gate", "a bundle whose source checkpoint is gone",
     lambda e: ["gate", e.bundle(lambda m: m["source"].__setitem__("path", str(e.path("gone.pth"))))], "is not available; pass --weights")  # fmt: skip
case("gate-recipe-unknown", "gate", "a manifest naming a recipe this ssmport does not know",
     lambda e: ["gate", e.bundle(lambda m: m["recipe"].__setitem__("name", "int3"))], "recipe 'int3'")  # fmt: skip
case("gate-architecture-unknown", "gate", "a manifest naming an architecture that is not registered",
     lambda e: ["gate", e.bundle(_set("architecture", "xlstm"))], "but the bundle is xlstm")  # fmt: skip
case("gate-read-only-bundle", "gate", "a bundle that cannot be written (checked before the gate runs)",
     lambda e: ["gate", e.immutable(e.bundle())], "the gate transcript")  # fmt: skip
case("gate-transcript-fifo", "gate", "a bundle whose gate.json is a named pipe (it would block)",
     lambda e: ["gate", (lambda b: (b / "gate.json").unlink() or os.mkfifo(b / "gate.json") or b)(e.bundle())],
     "gate.json is a named pipe inside the bundle")  # fmt: skip
case("gate-transcript-dir", "gate", "a bundle whose gate.json is a directory",
     lambda e: ["gate", (lambda b: (b / "gate.json").unlink() or (b / "gate.json").mkdir() or b)(e.bundle())], "is a directory")  # fmt: skip

# === the bundle and its manifest (read by every command; shown with inspect and generate) ===
case("manifest-prefill-function-missing", "generate", "a manifest naming a prefill function the asset lacks",
     lambda e: ["generate", e.bundle(lambda d: d["prefill"].__setitem__("function", "prefill_x")), "--prompt", "hi"],
     "the manifest names function 'prefill_x', which the asset does not have")  # fmt: skip
for field_name in ("bundle_id", "name", "architecture", "config", "source", "states", "plan", "asset", "inputs", "outputs", "recipe"):
    case(f"manifest-missing-{field_name}", "inspect", f"a manifest without its `{field_name}` field",
         lambda e, f=field_name: ["inspect", e.bundle(_drop(f))], f"missing field {field_name!r}")  # fmt: skip
for cid, what, edit, message in (
    ("manifest-not-object", "a manifest that is a JSON array", _whole(lambda m: [m]), "not an ssmport manifest"),
    ("manifest-other-format", "a manifest of another format", _set("format", "onnx-bundle"), "not an ssmport manifest"),
    ("manifest-version-newer", "a manifest format_version this ssmport does not read", _set("format_version", 99), "bundle format version 99"),
    ("manifest-version-string", "a format_version written as a string", _set("format_version", "2"), "bundle format version '2'"),
    ("manifest-config-list", "config that is a list", _set("config", []), "field 'config' has the wrong type (list)"),
    ("manifest-states-shape", "a state shape that is a string", lambda m: m["states"][0].__setitem__("shape", "x"),
     "field 'shape' has the wrong type (str)"),
    ("manifest-state-kind", "a state of an unknown kind", lambda m: m["states"][0].__setitem__("kind", "paged"), "has unknown kind 'paged'"),
    ("manifest-asset-bytes", "asset bytes that are a string", lambda m: m["asset"].__setitem__("bytes", "x"), "field 'bytes' has the wrong type"),
    ("manifest-asset-files", "asset files that are a list", lambda m: m["asset"].__setitem__("files", []), "field 'files' has the wrong type"),
    ("manifest-plan-summary", "a plan without its summary", lambda m: m["plan"].pop("summary"), "field 'plan' lacks its 'summary'"),
    ("manifest-plan-by-role", "a plan summary without by_role", lambda m: m["plan"]["summary"].pop("by_role"), "has no valid summary"),
    ("manifest-notes", "notes that are a number", _set("notes", 5), "field 'notes' has the wrong type"),
    ("manifest-export", "export statistics that are a list", _set("export", [1]), "field 'export' has the wrong type"),
    ("manifest-gate-partial", "a gate summary missing fields", _set("gate", {"passed": True}), "missing field(s) 'recipe'"),
    ("manifest-tokenizer-partial", "a tokenizer entry missing fields", _set("tokenizer", {"kind": "rwkv-world"}), "missing field(s) 'path'"),
    ("manifest-tokenizer-escapes", "a tokenizer path out of the bundle",
     lambda m: m["tokenizer"].__setitem__("path", "../../../etc/passwd"), "points outside the bundle"),
    ("manifest-asset-escapes", "an asset path out of the bundle", lambda m: m["asset"].__setitem__("path", "/etc"), "points outside the bundle"),
    ("manifest-no-logits", "a decode function with no outputs", _set("outputs", []), "the decode function lists no logits output"),
    ("manifest-prefill-chunk", "a prefill chunk that is not its input's (it sized a 10^9-token buffer)",
     lambda m: m["prefill"].__setitem__("chunk", 10**9), "prefill chunk 1000000000 does not match its input_ids [1, 8]"),
    ("manifest-prefill-chunk-0", "a prefill chunk of 0", lambda m: m["prefill"].__setitem__("chunk", 0), "prefill chunk 0 does not match"),
    ("manifest-synthetic-string", "synthetic_weights written as a string", _set("synthetic_weights", "no"), "'synthetic_weights' has the wrong type"),
):  # fmt: skip
    case(cid, "inspect", f"a manifest with {what}", lambda e, edit=edit: ["inspect", e.bundle(edit)], message)
case("manifest-nested", "inspect", "a manifest nested 100,000 deep",
     lambda e: ["inspect", (lambda b: (b / "manifest.json").write_text("[" * 100000 + "]" * 100000) and b)(e.bundle())], "unreadable manifest")  # fmt: skip
case("manifest-non-utf8", "inspect", "a manifest with bytes that are not UTF-8",
     lambda e: ["inspect", (lambda b: (b / "manifest.json").write_bytes(b'{"format": "\xff"}') and b)(e.bundle())], "unreadable manifest")  # fmt: skip
case("manifest-is-fifo", "inspect", "a manifest.json that is a named pipe (never opened)",
     lambda e: ["inspect", (lambda b: ((b / "manifest.json").unlink(), os.mkfifo(b / "manifest.json")) and b)(e.bundle())], "no manifest.json")  # fmt: skip
case("inspect-missing", "inspect", "a bundle that does not exist", lambda e: ["inspect", e.path("none")], "not a bundle directory")
case("inspect-file", "inspect", "a file given as the bundle", lambda e: ["inspect", e.write("f", "x")], "not a bundle directory")
case("inspect-no-asset", "inspect", "a bundle without its asset", lambda e: ["inspect", (lambda b: shutil.rmtree(b / "model.aimodel") or b)(e.bundle())],
     "bundle is incomplete (no model.aimodel/)")  # fmt: skip
case("inspect-asset-is-file", "inspect", "a bundle whose asset is a file",
     lambda e: ["inspect", (lambda b: (shutil.rmtree(b / "model.aimodel"), (b / "model.aimodel").write_text("x")) and b)(e.bundle())],
     "bundle is incomplete")  # fmt: skip
case("inspect-option", "inspect", "an unknown option", lambda e: ["inspect", e.tok, "--yaml"], "unrecognized arguments: --yaml")


# === damaged assets: checked against the manifest's sha256s before the runtime reads them ===
def _damage(e: Env, how: str, old_style: bool = False) -> Path:
    b = e.bundle()
    if old_style:  # a bundle exported before the sha256s were recorded
        e.edit_json(b / "manifest.json", lambda m: m["asset"].pop("files"))
    mlirb = next((b / "model.aimodel").glob("*.mlirb"))
    data = bytearray(mlirb.read_bytes())
    if how == "truncate":
        mlirb.write_bytes(bytes(data[: len(data) // 2]))
    elif how == "flip-header":
        data[1000] ^= 0xFF
        data[len(data) // 3] ^= 0x10
        mlirb.write_bytes(bytes(data))
    elif how == "flip-weight":
        data[-2000] ^= 0x01
        mlirb.write_bytes(bytes(data))
    elif how == "empty":
        for f in (b / "model.aimodel").iterdir():
            f.write_bytes(b"")
    elif how == "delete":
        mlirb.unlink()
    elif how == "extra":
        (b / "model.aimodel" / "extra.bin").write_bytes(b"x")
    elif how == "metadata":
        (b / "model.aimodel" / "metadata.json").write_text("{")
    return b


for how, what in (("truncate", "a truncated .mlirb (it aborted the runtime: SIGABRT)"),
                  ("flip-header", "a bit-flipped .mlirb (it aborted the runtime: SIGABRT)"),
                  ("flip-weight", "one flipped bit in a weight (it ran, silently, with another weight)"),
                  ("empty", "every asset file emptied"), ("delete", "an asset file deleted"),
                  ("extra", "a file added to the asset"), ("metadata", "the asset's metadata.json garbled")):  # fmt: skip
    case(f"asset-{how}", "generate", f"a damaged asset: {what}", lambda e, how=how: ["generate", _damage(e, how), "--tokens", "1,2"],
         "damaged or changed since export")  # fmt: skip
for how, what in (("truncate", "truncated"), ("flip-header", "bit-flipped")):
    case(f"asset-{how}-old-bundle", "generate", f"a {what} .mlirb in a bundle without recorded sha256s (the crash is contained)",
         lambda e, how=how: ["generate", _damage(e, how, old_style=True), "--tokens", "1,2"],
         "the runtime crashed reading it (SIGABRT)", process=True)  # fmt: skip
case("asset-empty-old-bundle", "generate", "emptied asset files in a bundle without recorded sha256s",
     lambda e: ["generate", _damage(e, "empty", old_style=True), "--tokens", "1,2"], "not a loadable Core AI asset", process=True)  # fmt: skip
case("asset-states-mismatch", "generate", "a manifest whose states are not the asset's",
     lambda e: ["generate", e.bundle(lambda m: m["states"][0].__setitem__("shape", [9, 9])), "--tokens", "1"], "do not match the manifest")  # fmt: skip

# === generate ===============================================================================
def option_cases(command: str, argv: Callable[[Env], list], rows) -> None:
    """One case per (id, option, value, message): `argv(e)` followed by the option."""
    for cid, flag, value, message in rows:
        case(f"{command}-{cid}", command, f"{flag} {value}", lambda e, flag=flag, value=value: [*argv(e), flag, value], message)


option_cases("generate", lambda e: ["generate", e.tok, "--tokens", "1"], (
    ("max-tokens-negative", "-n", "-1", "--max-tokens must be at least 0 (got -1)"),
    ("temperature-negative", "--temperature", "-1", "--temperature must be at least 0 (got -1)"),
    ("temperature-nan", "--temperature", "nan", "--temperature must be a finite number (got nan)"),
    ("temperature-inf", "--temperature", "inf", "--temperature must be a finite number (got inf)"),
    ("top-p-0", "--top-p", "0", "--top-p must be greater than 0 (got 0)"),
    ("top-p-above-1", "--top-p", "1.5", "--top-p must be at most 1 (got 1.5)"),
    ("top-p-nan", "--top-p", "nan", "--top-p must be a finite number (got nan)"),
    ("top-p-negative", "--top-p", "-0.5", "--top-p must be greater than 0"),
    ("seed-negative", "--seed", "-1", "--seed must be at least 0 (got -1)"),
    ("seed-huge", "--seed", str(2**40), "--seed must be at most 4,294,967,295"),
))  # fmt: skip
for cid, tokens, message in (("empty", "", "--tokens: no token ids given"), ("word", "1,two", "'two' is not an integer token id"),
                             ("out-of-range", "1,320", "outside the vocabulary [0, 320)"), ("negative", "-1", "token id(s) [-1] outside"),
                             ("huge", str(10**30), "outside the vocabulary"), ("float", "1.5", "'1.5' is not an integer token id")):  # fmt: skip
    case(f"generate-tokens-{cid}", "generate", f"--tokens {tokens!r}", lambda e, t=tokens: ["generate", e.tok, "--tokens", t], message)
case("generate-prompt-empty", "generate", "an empty --prompt", lambda e: ["generate", e.tok, "--prompt", ""], "--prompt: no token ids given")
case("generate-prompt-no-tokenizer", "generate", "--prompt for a bundle without a tokenizer", lambda e: ["generate", e.plain, "--prompt", "hi"],
     "has no tokenizer; use --tokens with ids")  # fmt: skip
case("generate-both", "generate", "--tokens and --prompt together", lambda e: ["generate", e.tok, "--tokens", "1", "--prompt", "x"],
     "not allowed with argument")  # fmt: skip
case("generate-neither", "generate", "neither --tokens nor --prompt", lambda e: ["generate", e.tok], "one of the arguments --tokens --prompt is required")
case("generate-tokenizer-missing", "generate", "a bundle whose tokenizer file is missing",
     lambda e: ["generate", (lambda b: (b / "tokenizer" / "vocab.tsv").unlink() or b)(e.bundle()), "--prompt", "Hi"], "vocab.tsv")  # fmt: skip
case("generate-tokenizer-garbled", "generate", "a bundle whose tokenizer file is garbled",
     lambda e: ["generate", (lambda b: (b / "tokenizer" / "vocab.tsv").write_text("1\tnot base64!\n") and b)(e.bundle()), "--prompt", "Hi"],
     "vocab.tsv:1: expected")  # fmt: skip
case("generate-missing-bundle", "generate", "a bundle that does not exist", lambda e: ["generate", e.path("none"), "--tokens", "1"], "not a bundle directory")
case("generate-max-tokens-text", "generate", "-n that is not a number", lambda e: ["generate", e.tok, "--tokens", "1", "-n", "lots"], "invalid int value")
_GEN = lambda e, *extra: ["generate", e.spec, "--tokens", "1,2", *extra]  # noqa: E731
case("generate-draft-unknown", "generate", "an unknown --draft (neither a drafter nor a bundle)",
     lambda e: _GEN(e, "--draft", e.path("lokup")), "not 'lookup', not 'mtp' and no such bundle")  # fmt: skip
case("generate-draft-mtp", "generate", "--draft mtp for a bundle without a draft head (no mtp.* exported)",
     lambda e: _GEN(e, "--draft", "mtp"), "has no draft head")  # fmt: skip
case("generate-draft-not-a-bundle", "generate", "--draft a folder that is not a bundle",
     lambda e: _GEN(e, "--draft", e.write("d/x", "x").parent), "not an ssmport bundle (no manifest.json)")  # fmt: skip
case("generate-draft-damaged", "generate", "--draft a bundle whose manifest is not JSON",
     lambda e: _GEN(e, "--draft", (lambda b: (b / "manifest.json").write_text("[") and b)(e.bundle())), "unreadable manifest")  # fmt: skip
case("generate-draft-other-tokenizer", "generate", "--draft a bundle with another tokenizer (not a draft for this target)",
     lambda e: _GEN(e, "--draft", e.plain), "its tokenizer differs from the target's")  # fmt: skip
case("generate-draft-target-without-verify", "generate", "--draft for a bundle exported without --verify",
     lambda e: ["generate", e.tok, "--tokens", "1,2", "--draft", "lookup"], "has no verify function, which speculative decoding needs")  # fmt: skip
case("generate-draft-bundle-target-without-verify", "generate", "--draft BUNDLE for a bundle exported without --verify",
     lambda e: ["generate", e.tok, "--tokens", "1,2", "--draft", e.spec], "has no verify function")  # fmt: skip
for did, value, message in (("0", "0", "--draft-tokens 0: this bundle's verify function checks 2 to 4 tokens a call"),
                            ("1", "1", "--draft-tokens 1: this bundle's verify function checks 2 to 4"),
                            ("negative", "-2", "--draft-tokens -2: this bundle's verify function checks 2 to 4"),
                            ("too-many", "5", "--draft-tokens 5: this bundle's verify function checks 2 to 4"),
                            ("text", "two", "argument --draft-tokens: invalid int value: 'two'")):  # fmt: skip
    case(f"generate-draft-tokens-{did}", "generate", f"--draft-tokens {value}",
         lambda e, value=value: _GEN(e, "--draft", "lookup", f"--draft-tokens={value}"), message)  # fmt: skip
case("generate-draft-tokens-without-draft", "generate", "--draft-tokens without --draft",
     lambda e: _GEN(e, "--draft-tokens", "2"), "--draft-tokens applies with --draft only")  # fmt: skip

# === logits =================================================================================
_T = lambda e: e.write("t.txt", "1 2 3")  # noqa: E731
case("logits-no-tokens-file", "logits", "no --tokens-file", lambda e: ["logits", e.tok, "--out", e.path("o.npy")], "the following arguments are required: --tokens-file")
case("logits-tokens-missing", "logits", "--tokens-file that does not exist", lambda e: ["logits", e.tok, "--tokens-file", e.path("t"), "--out", e.path("o.npy")],
     "cannot read (No such file or directory)")  # fmt: skip
case("logits-tokens-non-utf8", "logits", "--tokens-file with bytes that are not UTF-8",
     lambda e: ["logits", e.tok, "--tokens-file", e.write("t", b"1 \xff"), "--out", e.path("o.npy")], "not valid UTF-8 text")  # fmt: skip
case("logits-tokens-word", "logits", "--tokens-file with a word in it", lambda e: ["logits", e.tok, "--tokens-file", e.write("t", "1, 2, x3"), "--out", e.path("o.npy")],
     "'x3' is not an integer token id")  # fmt: skip
case("logits-tokens-range", "logits", "--tokens-file with ids outside the vocabulary",
     lambda e: ["logits", e.tok, "--tokens-file", e.write("t", "1 320"), "--out", e.path("o.npy")], "outside the vocabulary")  # fmt: skip
case("logits-tokens-empty", "logits", "an empty --tokens-file", lambda e: ["logits", e.tok, "--tokens-file", e.write("t", " \n"), "--out", e.path("o.npy")],
     "no token ids")  # fmt: skip
case("logits-out-directory", "logits", "--out that is a directory", lambda e: ["logits", e.tok, "--tokens-file", _T(e), "--out", e.tmp],
     "is a directory; give a file path")  # fmt: skip
case("logits-out-missing-dir", "logits", "--out in a folder that does not exist",
     lambda e: ["logits", e.tok, "--tokens-file", _T(e), "--out", e.path("no/o.npy")], "is not an existing directory")  # fmt: skip
case("logits-out-proc", "logits", "--out where nothing can be created", lambda e: ["logits", e.tok, "--tokens-file", _T(e), "--out", "/proc/o.npy"],
     "cannot write there")  # fmt: skip
case("logits-out-immutable", "logits", "--out in a folder nothing can be written to (checked before the run)",
     lambda e: ["logits", e.tok, "--tokens-file", _T(e), "--out", e.immutable(e.write("ro/keep", "x").parent) / "o.npy"], "cannot write there")  # fmt: skip
case("logits-out-too-long", "logits", "--out with a name longer than the system allows",
     lambda e: ["logits", e.tok, "--tokens-file", _T(e), "--out", e.path("o" * 300 + ".npy")], "File name too long")  # fmt: skip
case("logits-out-socket", "logits", "--out that is a socket", lambda e: ["logits", e.tok, "--tokens-file", _T(e), "--out", _socket(e)],
     "is not a regular file, a device or a pipe")  # fmt: skip
case("logits-backend-unknown", "logits", "an unknown --backend", lambda e: ["logits", e.tok, "--tokens-file", _T(e), "--out", e.path("o"), "--backend", "mlx"],
     "invalid choice: 'mlx'")  # fmt: skip
case("logits-torch-other-model", "logits", "--backend torch --weights of another model (it gave that model's logits, exit 0)",
     lambda e: ["logits", e.tok, "--tokens-file", _T(e), "--out", e.path("o.npy"), "--backend", "torch", "--weights", e.other_pth],
     "holds other values (same shapes, other weights)")  # fmt: skip
case("logits-torch-other-arch", "logits", "--backend torch --weights of another architecture",
     lambda e: ["logits", e.tok, "--tokens-file", _T(e), "--out", e.path("o.npy"), "--backend", "torch", "--weights", e.gdn],
     "is a gated_deltanet model, but the bundle is rwkv7")  # fmt: skip
case("logits-damaged-asset", "logits", "a damaged asset", lambda e: ["logits", _damage(e, "flip-weight"), "--tokens-file", _T(e), "--out", e.path("o.npy")],
     "damaged or changed since export")  # fmt: skip


def _socket(e: Env) -> Path:
    import socket

    path = e.path("sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    e.setup_done.append(s.close)
    return path


# === chat ===================================================================================
_SCRIPT = lambda e: e.write("script.txt", "hello\n")  # noqa: E731
option_cases("chat", lambda e: ["chat", e.tok, "--script", _SCRIPT(e)], (
    ("max-tokens-0", "-n", "0", "--max-tokens must be at least 1 (got 0)"),
    ("snapshots-0", "--max-snapshots", "0", "--max-snapshots must be at least 1 (got 0)"),
    ("snapshot-mb-0", "--snapshot-mb", "0", "--snapshot-mb must be greater than 0 (got 0)"),
    ("snapshot-mb-nan", "--snapshot-mb", "nan", "--snapshot-mb must be a finite number (got nan)"),
    ("snapshot-mb-inf", "--snapshot-mb", "inf", "--snapshot-mb must be a finite number (got inf)"),
    ("snapshot-mb-negative", "--snapshot-mb", "-1", "--snapshot-mb must be greater than 0"),
    ("temperature-nan", "--temperature", "nan", "--temperature must be a finite number"),
    ("top-p-2", "--top-p", "2", "--top-p must be at most 1"),
    ("seed-negative", "--seed", "-7", "--seed must be at least 0 (got -7)"),
))  # fmt: skip
case("chat-script-missing", "chat", "--script that does not exist", lambda e: ["chat", e.tok, "--script", e.path("s.txt")], "cannot read (No such file or directory)")
case("chat-script-dir", "chat", "--script that is a directory", lambda e: ["chat", e.tok, "--script", e.tmp], "cannot read (Is a directory)")
case("chat-script-non-utf8", "chat", "--script with bytes that are not UTF-8",
     lambda e: ["chat", e.tok, "--script", e.write("s.txt", b"hello \xff\xfe there\n")], "not valid UTF-8 text (byte 6)")  # fmt: skip
case("chat-stdin-non-utf8", "chat", "typed input (stdin) with bytes that are not UTF-8", lambda e: ["chat", e.tok],
     "standard input: not valid UTF-8 text", stdin=b"hi \xff there\n")  # fmt: skip
case("chat-stdin-non-utf8-utf8-mode", "chat", "typed input with bytes that are not UTF-8, where Python reads stdin with surrogateescape (the C locale, UTF-8 mode)",
     lambda e: ["chat", e.tok], "standard input: not valid UTF-8 text (invalid start byte at byte 3", stdin=b"hi \xff there\n",
     env=lambda e: {"PYTHONUTF8": "1"}, process=True)  # fmt: skip
case("chat-draft-unknown", "chat", "an unknown --draft", lambda e: ["chat", e.spec, "--script", _SCRIPT(e), "--draft", e.path("lokup")],
     "not 'lookup', not 'mtp' and no such bundle")  # fmt: skip
case("chat-draft-target-without-verify", "chat", "--draft for a bundle exported without --verify",
     lambda e: ["chat", e.tok, "--script", _SCRIPT(e), "--draft", "lookup"], "has no verify function")  # fmt: skip
case("chat-draft-tokens-0", "chat", "--draft-tokens 0", lambda e: ["chat", e.spec, "--script", _SCRIPT(e), "--draft", "lookup", "--draft-tokens", "0"],
     "--draft-tokens 0: this bundle's verify function checks 2 to 4")  # fmt: skip
case("chat-no-tokenizer", "chat", "a bundle without a tokenizer", lambda e: ["chat", e.plain, "--script", _SCRIPT(e)], "has no tokenizer, so it cannot chat in text")
case("chat-state-missing", "chat", "--state that does not exist", lambda e: ["chat", e.tok, "--script", _SCRIPT(e), "--state", e.path("s.st")],
     "cannot read (No such file or directory)")  # fmt: skip
case("chat-state-garbage", "chat", "--state that is not a snapshot", lambda e: ["chat", e.tok, "--script", _SCRIPT(e), "--state", e.write("s.st", "garbage")],
     "not a valid ssmport state snapshot")  # fmt: skip
case("chat-state-truncated", "chat", "a truncated --state",
     lambda e: ["chat", e.tok, "--script", _SCRIPT(e), "--state", e.write("s.st", e.snapshot.read_bytes()[:-64])], "not a valid ssmport state snapshot")  # fmt: skip
def _edited_snapshot(e: Env, edit: Callable[[dict], None]) -> Path:
    """A copy of the shared snapshot whose tensors `edit` changes (header kept)."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    with safe_open(str(e.snapshot), "np") as f:
        tensors, metadata = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()  # noqa: SIM118 (safe_open has no __iter__)
    edit(tensors)
    save_file(tensors, str(e.path("s.st")), metadata=metadata)
    return e.path("s.st")


def _nan_state(tensors: dict) -> None:
    name = next(k for k in tensors if k.startswith("state.") and tensors[k].dtype.kind == "f")
    tensors[name] = tensors[name].copy()
    tensors[name].flat[0] = float("nan")


case("chat-state-nan", "chat", "--state whose states hold NaN", lambda e: ["chat", e.tok, "--script", _SCRIPT(e), "--state", _edited_snapshot(e, _nan_state)],
     "holds NaN or infinite values")  # fmt: skip
case("chat-state-token-out-of-vocab", "chat", "--state whose token list holds an id outside the vocabulary",
     lambda e: ["chat", e.tok, "--script", _SCRIPT(e), "--state", _edited_snapshot(e, lambda t: t.__setitem__("tokens", t["tokens"] * 0 + 99999))],
     "holds token id 99999, outside the bundle's vocabulary")  # fmt: skip
case("export-checkpoint-fifo", "export", "a named pipe given as the checkpoint",
     lambda e: ["export", (lambda p: os.mkfifo(p) or p)(e.path("model.pth")), *_out(e)], "a named pipe, not a regular file")  # fmt: skip
case("export-vocab-device", "export", "a device given as --vocab", lambda e: ["export", e.pth, "--vocab", "/dev/zero", *_out(e)],
     "a device, not a regular file")  # fmt: skip


case("chat-state-device", "chat", "--state /dev/zero (never read forever)",
     lambda e: ["chat", e.tok, "--script", _SCRIPT(e), "--state", "/dev/zero"], "not a regular file")  # fmt: skip
case("chat-state-dir", "chat", "--state that is a directory", lambda e: ["chat", e.tok, "--script", _SCRIPT(e), "--state", e.tmp], "cannot read (Is a directory)")


def _snapshot_edit(e: Env, header_edit=None, states_edit=None) -> Path:
    from safetensors.numpy import load, save

    data = e.snapshot.read_bytes()
    tensors = load(data)
    n = int.from_bytes(data[:8], "little")
    meta = json.loads(data[8 : 8 + n])["__metadata__"]
    header = json.loads(meta["ssmport"])
    if header_edit:
        header_edit(header)
    if states_edit:
        tensors = states_edit(tensors)
    return e.write("s.st", save(tensors, metadata={"ssmport": json.dumps(header)}))


case("chat-state-other-bundle", "chat", "--state saved from another bundle",
     lambda e: ["chat", e.tok, "--script", _SCRIPT(e), "--state", _snapshot_edit(e, _set("bundle_id", "f" * 32))],
     "this state snapshot was taken from another bundle")  # fmt: skip
case("chat-state-wrong-dtype", "chat", "--state of the wrong dtype",
     lambda e: ["chat", e.tok, "--script", _SCRIPT(e), "--state",
                _snapshot_edit(e, states_edit=lambda t: {k: (v.astype("float16") if k.startswith("state.") else v) for k, v in t.items()})],
     "the bundle's are")  # fmt: skip
case("chat-state-version", "chat", "--state of a newer snapshot format",
     lambda e: ["chat", e.tok, "--script", _SCRIPT(e), "--state", _snapshot_edit(e, _set("version", 2))], "it is format version 2")  # fmt: skip
case("chat-state-token-count", "chat", "--state whose token count disagrees with its header",
     lambda e: ["chat", e.tok, "--script", _SCRIPT(e), "--state", _snapshot_edit(e, _set("token_count", 999))], "token count does not match")  # fmt: skip
case("chat-save-state-missing-dir", "chat", "--save-state in a folder that does not exist (checked before the chat)",
     lambda e: ["chat", e.tok, "--script", _SCRIPT(e), "--save-state", e.path("no/s.st")], "is not an existing directory")  # fmt: skip
case("chat-save-state-dir", "chat", "--save-state that is a directory", lambda e: ["chat", e.tok, "--script", _SCRIPT(e), "--save-state", e.tmp],
     "is a directory")  # fmt: skip
case("chat-save-state-proc", "chat", "--save-state where nothing can be created",
     lambda e: ["chat", e.tok, "--script", _SCRIPT(e), "--save-state", "/proc/s.st"], "cannot write there")  # fmt: skip
case("chat-save-state-immutable", "chat", "--save-state in a folder nothing can be written to (checked before the chat)",
     lambda e: ["chat", e.tok, "--script", _SCRIPT(e), "--save-state", e.immutable(e.write("ro/keep", "x").parent) / "s.st"], "cannot write there")  # fmt: skip

# === check-engine ===========================================================================
case("check-engine-missing-bundle", "check-engine", "a bundle that does not exist", lambda e: ["check-engine", e.path("none")],
     "not a bundle directory")  # fmt: skip
case("check-engine-file", "check-engine", "a file given as the bundle", lambda e: ["check-engine", e.write("f", "x")], "not a bundle directory")
case("check-engine-manifest-corrupt", "check-engine", "a manifest.json that is not JSON",
     lambda e: ["check-engine", (lambda b: (b / "manifest.json").write_text("[") and b)(e.bundle())], "unreadable manifest")  # fmt: skip
case("check-engine-layout-unknown", "check-engine", "a manifest naming a layout this ssmport does not know",
     lambda e: ["check-engine", e.bundle(_set("layout", "android"))], "unknown layout 'android'")  # fmt: skip
case("check-engine-no-asset", "check-engine", "a bundle without its asset",
     lambda e: ["check-engine", (lambda b: shutil.rmtree(b / "model.aimodel") or b)(e.bundle())], "bundle is incomplete")  # fmt: skip
case("check-engine-option", "check-engine", "an unknown option", lambda e: ["check-engine", e.tok, "--yaml"], "unrecognized arguments: --yaml")

# === bench ==================================================================================
option_cases("bench", lambda e: ["bench", e.tok], (("steps-0", "--steps", "0", "--steps must be at least 1 (got 0)"),
                                  ("steps-huge", "--steps", str(10**9), "--steps must be at most 100,000"),
                                  ("warmup-negative", "--warmup", "-1", "--warmup must be at least 0 (got -1)"),
                                  ("warmup-huge", "--warmup", str(10**9), "--warmup must be at most 100,000"),
                                  ("prefill-0", "--prefill-tokens", "0", "--prefill-tokens must be at least 1"),
                                  ("prefill-huge", "--prefill-tokens", str(10**9), "--prefill-tokens must be at most 100,000")))  # fmt: skip
case("bench-missing-bundle", "bench", "a bundle that does not exist", lambda e: ["bench", e.path("none")], "not a bundle directory")
case("bench-torch-other-weights", "bench", "--torch --weights of another model", lambda e: ["bench", e.tok, "--torch", "--weights", e.other_pth, "--no-roofline", "--steps", "1"],
     "holds other values")  # fmt: skip
case("bench-damaged-asset", "bench", "a damaged asset", lambda e: ["bench", _damage(e, "truncate"), "--no-roofline"], "damaged or changed since export")

# === list ===================================================================================
case("list-option", "list", "an unknown option", lambda e: ["list", "--all"], "unrecognized arguments: --all")
case("list-argument", "list", "an argument list does not take", lambda e: ["list", "rwkv7"], "unrecognized arguments: rwkv7")

# === tokenize ===============================================================================
_V = lambda e, text: e.write("vocab.txt", text)  # noqa: E731
case("tokenize-missing", "tokenize", "a vocab that does not exist", lambda e: ["tokenize", e.path("v.txt"), "--text", "hi"], "no such vocab file or bundle")
case("tokenize-dir", "tokenize", "a folder that is not a bundle", lambda e: ["tokenize", e.write("d/x", "x").parent, "--text", "hi"], "not an ssmport bundle")
case("tokenize-no-tokenizer", "tokenize", "a bundle without a tokenizer", lambda e: ["tokenize", e.plain, "--text", "hi"], "bundle has no tokenizer")
case("tokenize-no-text", "tokenize", "no --text", lambda e: ["tokenize", e.vocab], "the following arguments are required: --text")
for cid, what, text, message in (
    ("malformed", "a file that is not a vocab", "hello\n", "unrecognized vocab format"),
    ("non-utf8", "a vocab with bytes that are not UTF-8", b"1 'a' 1\n2 '\xff' 1\n", "vocab.txt:2: line is not valid UTF-8"),
    ("bad-literal", "a vocab line whose literal is code", "1 'a' 1\n2 __import__('os') 3\n", "vocab.txt:2: bad token literal"),
    ("bad-length", "a vocab line whose length is wrong", "1 'a' 1\n2 'bc' 3\n", "is 2 bytes but the line declares 3"),
    ("duplicate-id", "a vocab with an id twice", "1 'a' 1\n1 'b' 1\n", "duplicate token id 1"),
    ("duplicate-bytes", "a vocab with the same bytes twice", "1 'a' 1\n2 'a' 1\n", "duplicate token bytes"),
    ("empty", "an empty vocab", "", "unrecognized vocab format"),
    ("blank", "a vocab of blank lines", "\n\n\n", "unrecognized vocab format"),
    ("id-huge", "a vocab id beyond int32", f"1 'a' 1\n{2**31} 'b' 1\n", "is too large"),
    ("empty-token", "a vocab entry with no bytes", "1 'a' 1\n2 '' 0\n", "has an empty byte string"),
    ("tsv-bad-base64", "a vocab.tsv with bad base64", "1\tYQ==\n2\t!!\n", "expected '<id>\\t<base64 bytes>'"),
    ("tsv-order", "a vocab.tsv out of order", "2\tYQ==\n1\tYg==\n", "is out of order"),
    ("unencodable", "text the vocab cannot encode", "1 'a' 1\n2 'b' 1\n", "--text: cannot encode byte 0x63"),
):  # fmt: skip
    case(f"tokenize-vocab-{cid}", "tokenize", what, lambda e, text=text: ["tokenize", _V(e, text), "--text", "abc"], message)
case("tokenize-json-invalid", "tokenize", "a tokenizer.json that is not JSON", lambda e: ["tokenize", e.write("tokenizer.json", "{"), "--text", "x"],
     "not a loadable tokenizer.json")  # fmt: skip
case("tokenize-json-no-model", "tokenize", "a tokenizer.json without a model", lambda e: ["tokenize", e.write("tokenizer.json", "{}"), "--text", "x"],
     "not a loadable tokenizer.json")  # fmt: skip
case("tokenize-json-nested", "tokenize", "a tokenizer.json nested 100,000 deep",
     lambda e: ["tokenize", e.write("tokenizer.json", "[" * 100000 + "]" * 100000), "--text", "x"], "not a")  # fmt: skip

# === tokenizer export =======================================================================
case("tokenizer-no-out", "tokenizer", "no -o", lambda e: ["tokenizer", "export", e.vocab], "the following arguments are required: -o/--out")
case("tokenizer-no-action", "tokenizer", "no action", lambda e: ["tokenizer"], "the following arguments are required: ACTION")
case("tokenizer-vocab-missing", "tokenizer", "a vocab that does not exist", lambda e: ["tokenizer", "export", e.path("v.txt"), "-o", e.path("v.tsv")],
     "cannot read vocab file: No such file or directory")  # fmt: skip
case("tokenizer-vocab-dir", "tokenizer", "a folder without a vocab", lambda e: ["tokenizer", "export", e.write("d/x", "x").parent, "-o", e.path("v.tsv")],
     "no RWKV World vocab file in this directory")  # fmt: skip
case("tokenizer-vocab-json", "tokenizer", "a tokenizer.json (not a World vocab)", lambda e: ["tokenizer", "export", e.write("t.json", "{}"), "-o", e.path("v.tsv")],
     "unrecognized vocab format")  # fmt: skip
for cid, text, message in (("malformed", "hello\n", "unrecognized vocab format"), ("duplicate", "1 'a' 1\n1 'b' 1\n", "duplicate token id 1"),
                           ("non-utf8", b"1 '\xff' 1\n", "line is not valid UTF-8"), ("bad-length", "1 'ab' 1\n", "declares 1"),
                           ("no-single-bytes", "1 'ab' 2\n2 'cd' 2\n", "cannot encode the verification text")):  # fmt: skip
    case(f"tokenizer-vocab-{cid}", "tokenizer", f"a vocab: {cid.replace('-', ' ')}", lambda e, text=text: ["tokenizer", "export", _V(e, text), "-o", e.path("v.tsv")], message)
case("tokenizer-out-dir", "tokenizer", "-o that is a directory", lambda e: ["tokenizer", "export", e.vocab, "-o", e.tmp], "is a directory; give a file path")
case("tokenizer-out-missing-dir", "tokenizer", "-o in a folder that does not exist",
     lambda e: ["tokenizer", "export", e.vocab, "-o", e.path("no/v.tsv")], "cannot write")  # fmt: skip
case("tokenizer-out-proc", "tokenizer", "-o where nothing can be created", lambda e: ["tokenizer", "export", e.vocab, "-o", "/proc/v.tsv"], "cannot write")
case("tokenizer-out-immutable", "tokenizer", "-o in a folder nothing can be written to",
     lambda e: ["tokenizer", "export", e.vocab, "-o", e.immutable(e.write("ro/keep", "x").parent) / "v.tsv"], "cannot write")  # fmt: skip
case("tokenizer-out-too-long", "tokenizer", "-o with a name longer than the system allows",
     lambda e: ["tokenizer", "export", e.vocab, "-o", e.path("v" * 300)], "File name too long")  # fmt: skip
case("tokenizer-out-socket", "tokenizer", "-o that is a socket", lambda e: ["tokenizer", "export", e.vocab, "-o", _socket(e)], "is not a regular file")


# === the generated docs ====================================================================
BEGIN, END = "<!-- bad-inputs: begin (generated from tests/bad_inputs.py) -->", "<!-- bad-inputs: end -->"
_ORDER = ("ssmport", "--plugin", "export", "gate", "logits", "generate", "chat", "inspect", "check-engine", "bench", "list",
          "tokenize", "tokenizer")  # fmt: skip


def markdown() -> str:
    """The docs/errors.md table: one row per case, grouped by command."""
    lines = [BEGIN, "", f"{len(CASES)} cases, each a row of `tests/bad_inputs.py` run by `tests/test_bad_inputs.py`.", ""]
    for command in _ORDER:
        rows = [c for c in CASES if c.command == command]
        if not rows:
            continue
        title = {"ssmport": "the program itself", "--plugin": "`--plugin` / `SSMPORT_PLUGINS`", "tokenizer": "`tokenizer export`"}.get(command, f"`{command}`")
        lines += [f"### {title}", "", "| bad input | exit | what the user sees (`ssmport: error: ...`) |", "|---|---|---|"]
        for c in rows:
            message = c.message.replace("|", "\\|").replace("`", "'")
            lines.append(f"| {c.what.replace('|', '/')} | {c.code} | `...{message}...` |")
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def write_docs(path: Path) -> bool:
    text = path.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    new = text[:start] + markdown() + text[end:]
    if new != text:
        path.write_text(new)
    return new != text


assert len({c.id for c in CASES}) == len(CASES), "case ids must be unique"

if __name__ == "__main__":
    docs = Path(__file__).resolve().parents[1] / "docs" / "errors.md"
    print(f"{docs}: {'rewritten' if write_docs(docs) else 'already current'} ({len(CASES)} cases)")
    sys.exit(0)
