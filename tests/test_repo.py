"""The repository's promises about itself."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    shipped = ROOT / "ssmport" / "loader" / "pretrained"
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


# An architecture's own code: these modules of its package (docs/adding-an-architecture.md).
ARCHITECTURE_MODULES = ("config", "checkpoints", "reference", "block", "quant", "synthetic")
SLOC_BUDGET = 350  # per package; what two families share lives once, in ssmport/models/*.py or ssmport/ops
_NOT_CODE = {"COMMENT", "NL", "NEWLINE", "INDENT", "DEDENT", "ENCODING", "ENDMARKER"}


def source_lines(text: str) -> int:
    """Lines that carry code: blank lines, comments and docstrings (a string that is a
    statement on its own) do not count; a token spanning lines counts each of them."""
    import io
    import tokenize

    tokens = [t for t in tokenize.generate_tokens(io.StringIO(text).readline)
              if tokenize.tok_name[t.type] not in ("COMMENT", "NL")]  # fmt: skip
    lines: set[int] = set()
    for i, tok in enumerate(tokens):
        if tokenize.tok_name[tok.type] in _NOT_CODE:
            continue
        if tok.type == tokenize.STRING:
            before = tokenize.tok_name[tokens[i - 1].type] if i else "ENCODING"
            after = tokenize.tok_name[tokens[i + 1].type]
            if before in ("NEWLINE", "INDENT", "DEDENT", "ENCODING") and after in ("NEWLINE", "ENDMARKER"):
                continue  # a docstring (or any bare string statement)
        lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines)


def architecture_sloc() -> dict[str, int]:
    """Source lines of each built-in architecture's own modules, by package."""
    counts = {}
    for package in sorted(p for p in (ROOT / "ssmport" / "models").iterdir() if p.is_dir()):
        files = [package / f"{m}.py" for m in ARCHITECTURE_MODULES]
        if all(f.is_file() for f in files):
            counts[package.name] = sum(source_lines(f.read_text()) for f in files)
    return counts


def test_source_lines_counts_code_only():
    text = '"""Doc."""\n\nimport os  # why\n\n\ndef f():\n    """Doc\n    more."""\n    s = """a\nb"""\n    return s\n'
    assert source_lines(text) == 5  # import, def, the two lines of s, return


# rwkv7 is over: its two checkpoint layouts (BlinkDL .pth and fla's three generations) are
# 128 of its 391 lines, and nothing else shares them. Strict: the mark must go once it fits.
OVER_BUDGET = {"rwkv7": "issue 14: rwkv7 is 373 source lines, over the 350 budget"}


def test_every_built_in_architecture_is_counted():
    assert len(architecture_sloc()) >= 7


@pytest.mark.parametrize(
    "package",
    [pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=OVER_BUDGET[name])) if name in OVER_BUDGET else name
     for name in architecture_sloc()],
)  # fmt: skip
def test_each_architecture_is_at_most_350_source_lines(package):
    n = architecture_sloc()[package]
    assert n <= SLOC_BUDGET, f"{package}: {n} source lines ({', '.join(ARCHITECTURE_MODULES)}), over {SLOC_BUDGET}"
