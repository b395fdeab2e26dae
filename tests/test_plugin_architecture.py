"""A new architecture added from outside the package works with every command.

The toy RNN (tests/toyrnn.py) uses only ssmport's public API. Everything that registers it
runs in a fresh interpreter, so the registry of this test process is never touched.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

PLUGIN = Path(__file__).with_name("toyrnn_plugin.py")

DRIVER = textwrap.dedent(
    """
    import sys, torch
    import ssmport
    from ssmport.cli.main import main
    from ssmport.plugins import load_plugin

    plugin, out = sys.argv[1], sys.argv[2]
    toy = load_plugin(plugin).TOY
    assert load_plugin(plugin).TOY is toy  # loading again is a no-op, not a second registration
    assert ssmport.get_architecture("toyrnn") is toy and "toyrnn-tiny" in ssmport.presets()
    result = ssmport.export("toyrnn-tiny", out, quant="fp32", gate_steps=10, progress=False)
    assert result.manifest.gate.passed, result.manifest.gate
    assert [s.name for s in result.manifest.states] == ["h"]
    i8 = ssmport.export("toyrnn-tiny", out, quant="int8keepproj", gate_steps=6, progress=False)
    kinds = {e["name"]: e["dtype"] for e in i8.manifest.plan_tensors}
    assert kinds["out"] == "int8" and kinds["l0.w"] == "float16", kinds
    assert i8.manifest.gate.passed
    # a checkpoint on disk, found by the plugin's matches_pth
    weights = toy.synthetic_weights(toy.config_from_json({"vocab_size": 50, "width": 32, "layers": 3}), 1)
    torch.save({n: weights[n] for n in weights}, out + "/toy.pth")
    assert ssmport.load_model(out + "/toy.pth").config.layers == 3
    print("plugin ok")
    """
)


def _run(*argv, env=None):
    return subprocess.run([sys.executable, *map(str, argv)], capture_output=True, text=True, env=env)


def test_external_architecture_end_to_end(tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    proc = _run(driver, PLUGIN, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "plugin ok" in proc.stdout


def test_cli_plugin_flag_and_env(tmp_path):
    cli = ("-m", "ssmport.cli.main")
    proc = _run(*cli, "--plugin", PLUGIN, "export", "toyrnn-tiny", "-o", tmp_path, "--gate-steps", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    bundle = tmp_path / "toyrnn-tiny-fp32"
    assert (bundle / "manifest.json").is_file()
    # gating again rebuilds the source, which needs the plugin: without it, one line naming it
    proc = _run(*cli, "gate", bundle, "--steps", "3", "--prompts", "1")
    assert proc.returncode == 2 and f"pass --plugin {PLUGIN.resolve()}" in proc.stderr, proc.stderr
    assert "architecture 'toyrnn' is registered by the plugin" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    env = os.environ | {"SSMPORT_PLUGINS": str(PLUGIN)}
    proc = _run(*cli, "gate", bundle, "--steps", "3", "--prompts", "1", env=env)
    assert proc.returncode == 0 and proc.stdout.startswith("PASS"), proc.stderr[-2000:]
    proc = _run(*cli, "--plugin", PLUGIN, "list")
    assert "toyrnn-tiny" in proc.stdout


def test_plugin_errors_are_one_line(tmp_path, capsys):
    """In-process: none of these plugins gets as far as registering anything."""
    from ssmport.cli.main import main

    broken = tmp_path / "broken.py"
    broken.write_text("import ssmport\nraise RuntimeError('half-written plugin')\n")
    cases = [
        (tmp_path / "absent.py", "no such file"),
        ("no_such_plugin_module", "no such file or importable module"),
        (broken, "failed to import: RuntimeError: half-written plugin at"),
    ]
    for plugin, message in cases:
        assert main(["--plugin", str(plugin), "list"]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


def test_register_refuses_inconsistent_architectures():
    """Each refusal happens before the registry changes, so this runs in-process."""
    import pytest

    import ssmport
    from ssmport.architectures import architectures
    from toyrnn import make_toy

    before = [a.name for a in architectures()]
    bad_tiny = make_toy("toy_bad_tiny")
    bad_tiny.tiny_preset = "nope"
    foreign = make_toy("toy_foreign")
    foreign.presets, foreign.tiny_preset = (ssmport.Preset("toy-foreign-p", "rwkv7", {}, "", released=False),), None
    clash = make_toy("toy_clash")
    clash.presets, clash.tiny_preset = (ssmport.Preset("rwkv7-tiny", "toy_clash", {}, "", released=False),), None
    cases = [(bad_tiny, "tiny_preset 'nope'"), (foreign, "name another architecture"),
             (clash, "already registered: rwkv7-tiny"), (ssmport.get_architecture("rwkv7"), "already registered")]
    for arch, message in cases:
        with pytest.raises(ValueError, match=message):
            ssmport.register_architecture(arch)
    with pytest.raises(TypeError):
        ssmport.register_architecture(object())
    assert [a.name for a in architectures()] == before
