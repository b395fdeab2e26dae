"""The repository's promises about itself."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    lines = ROOT.joinpath("README.md").read_text().splitlines()
    assert lines[0].startswith("```"), "the README must start with its two commands"
    end = lines.index("```", 1)
    return lines[1:end]


def test_readme_starts_with_exactly_two_commands():
    commands = readme_commands()
    assert len(commands) == 2
    assert "rwkv7-pydoc" in commands[0] and "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci = ROOT.joinpath(".ci", "run").read_text().splitlines()
    assert readme_commands()[1] in ci


def test_shipped_model_files_fit_the_wheel_budget():
    """The trained default ships inside the wheel, which may grow by at most 10 MB for it
    (uncompressed here; zip shrinks fp16 weights by ~8%)."""
    shipped = ROOT / "ssmport" / "pretrained"
    total = sum(p.stat().st_size for p in shipped.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    assert total <= 10 * 2**20


def test_every_model_package_imports_on_its_own():
    """A model package imported before anything else in ssmport (as a plugin author's code
    does) must not trip over the registry registering the built-ins."""
    import subprocess
    import sys

    packages = sorted(p.parent.name for p in (ROOT / "ssmport" / "models").glob("*/__init__.py"))
    for name in packages:
        code = f"import ssmport.models.{name}, ssmport.architectures as a; assert a.presets()"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert done.returncode == 0, (name, done.stderr[-500:])
    assert len(packages) >= 3
