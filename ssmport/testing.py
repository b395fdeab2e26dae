"""Contract checks every architecture gets for free.

`check_architecture(arch, tiny, workdir)` takes a registered architecture and a tiny config
(a preset name or a config dict), builds it with synthetic weights, exports it, runs it on
the Core AI runtime, and checks what every architecture must satisfy:

    registered       it is the instance `get_architecture(arch.name)` returns
    config           `config_from_json(to_json())` round-trips through JSON
    synthetic        synthetic weights are deterministic and shaped as declared
    states           state specs: unique names, shapes, the requested dtype; the decode
                     module registers exactly these buffers, in this order
    builder          every weight of the decode module was stored through the WeightBuilder
                     (so quantization and the manifest's plan see all of it)
    reference        the export-form module (torch, fp32) matches the plain reference loop
    quant            int8keepproj (the architecture's `keeps_float` at work) stays within
                     its gate budget against fp32, in torch
    ir (fp16 state)  the converted graph: names, order, shapes, dtypes; one write per state
    export + gate    a full fp32 export passes its gate on the Core AI runtime
    coreai           the bundle on the Core AI runtime matches the reference loop; every
                     state is bound by name, written, and zeroed by `reset`
    strict loading   with `checkpoint=`: it loads to the same canonical names and shapes, and
                     a missing, an unexpected and a misshaped tensor are each refused with
                     one line naming it
    prefill          when the architecture has a prefill form: prefill == the M=1 loop

Each check is reported with a clear message; `ContractReport.assert_ok()` (or
`assert_architecture`) raises one AssertionError listing every failure. In a test::

    from ssmport.testing import assert_architecture

    def test_my_architecture(tmp_path):
        assert_architecture(MY_ARCH, "myarch-tiny", tmp_path, checkpoint=write_tiny_checkpoint(tmp_path))
"""

from __future__ import annotations

import json
import re
import shutil
import traceback
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ssmport.architectures import Architecture, LoadedModel, architectures, presets
from ssmport.errors import CheckpointError

CHECKS = ("registered", "config", "synthetic", "states", "builder", "reference", "quant", "ir (fp16 state)",
          "export + gate", "coreai", "strict loading", "prefill")  # fmt: skip
FP32_REL_TOLERANCE = 1e-4  # fp32 vs fp32 differs by summation order only (docs/parity.md)
PREFILL_CHUNK = 5  # does not divide the default 12 steps: full chunks and a padded one
UNEXPECTED_TENSOR = "ssmport_contract_probe.unexpected"


@dataclass
class Check:
    """One contract property: passed (True), failed (False) or skipped (None)."""

    name: str
    passed: bool | None
    detail: str = ""

    def line(self) -> str:
        """One line: "ok  " / "FAIL" / "skip", the name, and the detail."""
        mark = {True: "ok  ", False: "FAIL", None: "skip"}[self.passed]
        return f"{mark} {self.name}" + (f": {self.detail}" if self.detail else "")


@dataclass
class ContractReport:
    """The result of `check_architecture`: every check, and the bundle it exported."""

    architecture: str
    checks: list[Check] = field(default_factory=list)
    bundle: Path | None = None

    @property
    def failures(self) -> list[Check]:
        """The failed checks (skipped ones are not failures)."""
        return [c for c in self.checks if c.passed is False]

    @property
    def passed(self) -> bool:
        return not self.failures

    def get(self, name: str) -> Check:
        """The check called `name` (see CHECKS)."""
        return next(c for c in self.checks if c.name == name)

    def __str__(self) -> str:
        return f"contract of {self.architecture}:\n" + "\n".join("  " + c.line() for c in self.checks)

    def assert_ok(self) -> ContractReport:
        """Raise AssertionError listing every failed check; return self otherwise."""
        if self.failures:
            raise AssertionError(str(self))
        return self


def assert_architecture(
    arch: Architecture, tiny: str | Mapping[str, Any] | None, workdir: str | Path, **kwargs
) -> ContractReport:
    """`check_architecture(...)`, raising one AssertionError that lists every failure."""
    return check_architecture(arch, tiny, workdir, **kwargs).assert_ok()


def check_architecture(
    arch: Architecture,
    tiny: str | Mapping[str, Any] | None,
    workdir: str | Path,
    *,
    checkpoint: str | Path | None = None,
    strict_probe: str | None = None,
    seed: int = 0,
    steps: int = 12,
    only: Collection[str] | None = None,
) -> ContractReport:
    """Check the contract of a registered architecture on a tiny config.

    Args:
        arch: the architecture (it must already be registered).
        tiny: a preset name, a config dict (`config_from_json` input), or None for the
            architecture's `tiny_preset`. Keep it small: it is exported and run.
        workdir: an empty directory for the bundle and checkpoint copies.
        checkpoint: a small checkpoint of this architecture on disk (`.pth` or a Hugging
            Face folder) for the strict-loading check; skipped without one.
        strict_probe: the checkpoint tensor to drop and misshape in that check (default: a
            layer-1 tensor, chosen by name).
        seed: synthetic-weight and token seed.
        steps: tokens fed in each parity comparison.
        only: run just these checks (names as in the report; "config" always runs).
    """
    unknown = set(only or ()) - set(CHECKS)
    if unknown:
        raise ValueError(f"unknown check(s) {sorted(unknown)}; choose from {list(CHECKS)}")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    report = ContractReport(arch.name)
    run = _Runner(report, only)

    run("registered", lambda: _check_registered(arch))
    model = run("config", lambda: _synthetic_model(arch, tiny, seed))
    if model is None:
        return report
    tokens = _tokens(model.config.vocab_size, steps, seed)
    run("synthetic", lambda: _check_synthetic(arch, model, seed))
    run("states", lambda: _check_states(arch, model))
    run("builder", lambda: _check_builder(arch, model))
    reference = run("reference", lambda: _check_reference(arch, model, tokens))
    run("quant", lambda: _check_quant(model, tokens))
    run("ir (fp16 state)", lambda: _check_ir(arch, model, torch.float16))
    exported = _as_bf16_checkpoint(model)
    bundle = run("export + gate", lambda: _export(exported, workdir / "bundles"))
    report.bundle = bundle
    run("coreai", lambda: _check_coreai(arch, exported, bundle, tokens, reference))
    run("strict loading", lambda: _check_strict(arch, model, checkpoint, workdir / "strict", strict_probe))
    run("prefill", lambda: _check_prefill(arch, model, tokens, workdir / "prefill"))
    return report


def _require(condition: Any, message: str) -> None:
    """A contract check: an AssertionError with the reason (unlike `assert`, never
    stripped by `python -O`)."""
    if not condition:
        raise AssertionError(message)


class _Skip(Exception):
    """Raised by a check that does not apply."""


class _Runner:
    """Run one check: its return value is (detail, value); any exception fails it."""

    def __init__(self, report: ContractReport, only: Collection[str] | None):
        self.report = report
        self.only = None if only is None else set(only) | {"config"}
        if self.only and "coreai" in self.only:  # compares the exported bundle with the reference
            self.only |= {"reference", "export + gate"}

    def __call__(self, name: str, fn: Callable[[], Any]) -> Any:
        if self.only is not None and name not in self.only:
            self.report.checks.append(Check(name, None, "not selected"))
            return None
        try:
            detail, value = fn()
        except _Skip as skip:
            self.report.checks.append(Check(name, None, str(skip)))
            return None
        except AssertionError as exc:
            self.report.checks.append(Check(name, False, str(exc)))
            return None
        except Exception as exc:  # a crash in the architecture is a failed check, with where
            where = traceback.extract_tb(exc.__traceback__)[-1]
            self.report.checks.append(
                Check(name, False, f"{type(exc).__name__}: {exc} (at {where.filename}:{where.lineno})")
            )
            return None
        self.report.checks.append(Check(name, True, detail))
        return value


# --------------------------------------------------------------------------------------
# The checks. Each returns (detail, value) or raises AssertionError with the reason.
# --------------------------------------------------------------------------------------


def _check_registered(arch: Architecture):
    registered = {a.name: a for a in architectures()}.get(arch.name)
    _require(registered is not None, f"{arch.name!r} is not registered: call ssmport.register_architecture on it")
    _require(registered is arch, f"get_architecture({arch.name!r}) returns another object: call register_architecture")
    return "", None


def _synthetic_model(arch: Architecture, tiny, seed: int):
    if tiny is None:
        if arch.tiny_preset is None:
            raise AssertionError("no tiny config given and the architecture declares no tiny_preset")
        tiny = arch.tiny_preset
    if isinstance(tiny, str):
        preset = presets().get(tiny)
        _require(preset is not None, f"preset {tiny!r} is not registered")
        _require(preset.architecture == arch.name, f"preset {tiny!r} belongs to {preset.architecture!r}")
        data, provenance = dict(preset.config), {"kind": "synthetic", "preset": tiny, "seed": seed}
    else:
        data, provenance = dict(tiny), {"kind": "synthetic", "seed": seed}
    config = arch.config_from_json(data)
    as_json = json.loads(json.dumps(config.to_json()))
    again = arch.config_from_json(as_json)
    _require(again == config, f"config_from_json(to_json()) gives {again!r}, not {config!r}")
    _require(isinstance(getattr(config, "vocab_size", None), int), "the config has no int vocab_size")
    model = LoadedModel(arch, config, arch.synthetic_weights(config, seed), provenance, name=f"{arch.name}-contract")
    return f"vocab {config.vocab_size}", model


def _check_synthetic(arch: Architecture, model: LoadedModel, seed: int):
    a, b = model.weights, arch.synthetic_weights(model.config, seed)
    _require(list(a) and list(a) == list(b), "synthetic weights have no tensors or differ in names between calls")
    other = arch.synthetic_weights(model.config, seed + 1)
    differs = False
    for name in a:
        t = a[name]
        shape = tuple(t.shape)
        _require(shape == a.shape(name), f"{name}: tensor shape {list(shape)} != declared {list(a.shape(name))}")
        _require(torch.equal(t, b[name]), f"{name}: not deterministic for seed {seed}")
        _require(torch.isfinite(t).all(), f"{name}: not finite")
        differs = differs or not torch.equal(t, other[name])
    _require(differs, "the seed changes nothing")
    return f"{len(a)} tensors, deterministic", None


def _check_states(arch: Architecture, model: LoadedModel):
    from ssmport.exporter.convert import check_buffers  # the exporter's own check
    from ssmport.quant import get_recipe
    from ssmport.quant.plan import WeightBuilder

    for dtype in (torch.float32, torch.float16):
        specs = arch.state_specs(model.config, dtype)
        names = [s.name for s in specs]
        _require(specs, "no states: a recurrent model carries state between tokens")
        _require(len(set(names)) == len(names), f"duplicate state names {names}")
        for s in specs:
            _require(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", s.name), f"state name {s.name!r} is not an identifier")
            _require(s.dtype == dtype, f"state {s.name} has dtype {s.dtype}, asked for {dtype}")
            _require(s.shape and all(isinstance(d, int) and d > 0 for d in s.shape), f"state {s.name} shape {s.shape}")
            _require(s.axes, f"state {s.name} has no axis legend")
        with torch.no_grad():
            builder = WeightBuilder(get_recipe("fp32"), arch.keeps_float)
            module = arch.build_decode(model.config, model.weights, builder, dtype)
        check_buffers(module, specs)
    return ", ".join(f"{s.name}{list(s.shape)}" for s in specs), None


def _check_builder(arch: Architecture, model: LoadedModel):
    from ssmport.quant import get_recipe
    from ssmport.quant.plan import WeightBuilder

    builder = WeightBuilder(get_recipe("fp32"), arch.keeps_float)
    with torch.no_grad():
        module = arch.build_decode(model.config, model.weights, builder, torch.float32)
    held = sum(p.numel() * p.element_size() for p in module.parameters())
    planned = sum(e.bytes for e in builder.entries)
    _require(
        held == planned,
        f"the decode module holds {held} bytes of parameters but the WeightBuilder stored {planned}: "
        "request every weight from the builder (matmul / table / vector)",
    )
    return f"{len(builder.entries)} tensors, {planned} bytes", None


def _check_reference(arch: Architecture, model: LoadedModel, tokens: list[int]):
    from ssmport.gate.torch_runner import TorchRunner

    ref = reference_logits(arch, model, tokens)
    runner = TorchRunner(model, "fp32")
    try:
        got = step_logits(runner, tokens)
    finally:
        runner.close()
    err = _require_close(ref, got, "export-form module vs reference loop")
    return f"max rel |Δ| {err:.1e} over {len(tokens)} steps", ref


def _check_quant(model: LoadedModel, tokens: list[int]):
    from ssmport.gate.report import run_gate
    from ssmport.quant import get_recipe
    from ssmport.gate.torch_runner import TorchRunner

    recipe = get_recipe("int8keepproj")
    candidate = TorchRunner(model, recipe.name)
    reference = TorchRunner(model, "fp32")
    try:
        report = run_gate(candidate, reference, [tokens], recipe.name, recipe.gate, synthetic=True)
    finally:
        candidate.close()
        reference.close()
    dtypes = {e.dtype for e in candidate.builder.entries}
    _require(report.passed, f"int8keepproj in torch fails its gate: {report.headline()}")
    return f"{report.headline()}; stored dtypes {sorted(dtypes)}", None


def _check_ir(arch: Architecture, model: LoadedModel, state_dtype: torch.dtype):
    from ssmport.exporter.convert import convert
    from ssmport.quant import get_recipe
    from ssmport.quant.plan import WeightBuilder

    builder = WeightBuilder(get_recipe("fp32"), arch.keeps_float)
    converted = convert(model, builder, state_dtype, prefill_chunk=None)  # checks the contract
    sig = converted.decode if hasattr(converted, "decode") else converted[1]
    writes = ", ".join(f"{n} x{c}" for n, c in sig.writes_per_state.items())
    return f"writes {writes}", None


def _as_bf16_checkpoint(model: LoadedModel) -> LoadedModel:
    """`model` with its float weights rounded to bf16 and read as a bf16 checkpoint is: each
    read a fresh fp32 tensor, which the exporter frees once converted (memory-mapped fp32
    files and in-memory weights are never freed, so they hide a weight that is a view of a
    storage other weights share)."""
    from ssmport.loader.checkpoint import DictSource, MappedSource

    def bf16(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.bfloat16) if t.is_floating_point() else t

    def fp32(t: torch.Tensor) -> torch.Tensor:
        return t.float() if t.dtype == torch.bfloat16 else t

    stored = DictSource({n: bf16(model.weights[n]) for n in model.weights}, origin="<bf16 copy>")
    weights = MappedSource(stored, {n: (n, fp32) for n in stored}, model.weights.shapes())
    return replace(model, weights=weights)


def _export(model: LoadedModel, out: Path):
    from ssmport.exporter.pipeline import export

    result = export(model, out, quant="fp32", gate_steps=8, progress=False, overwrite=True, prefill_chunk=None)
    gate = result.manifest.gate
    _require(gate.passed, f"the export's gate failed: {result.gate_headline}")
    return result.gate_headline, result.path


def _check_coreai(arch: Architecture, model: LoadedModel, bundle: Path | None, tokens: list[int], ref):
    from ssmport.runtime import Runner

    if bundle is None or ref is None:
        raise _Skip("needs a passing export and reference check")
    ref = reference_logits(arch, model, tokens)  # the exported (bf16-rounded) weights' own
    specs = arch.state_specs(model.config, torch.float32)
    with Runner(bundle) as runner:
        names = runner.state_names
        _require(names == [s.name for s in specs], f"runtime states {names} != declared {[s.name for s in specs]}")
        # full shapes: a KV cache may be exported with a growing position axis (ssmport.growing_kv)
        manifest_states = [(s.name, s.full_shape, s.dtype) for s in runner.bundle.manifest.states]
        declared = [(s.name, s.full_shape, s.numpy_dtype.name) for s in specs]
        _require(manifest_states == declared, f"manifest states {manifest_states} != declared {declared}")
        got = step_logits(runner, tokens)
        unwritten = [n for n in names if not runner.state(n).any()]
        _require(not unwritten, f"state(s) {unwritten} still all zero after {len(tokens)} tokens")
        runner.reset()
        _require(not any(runner.state(n).any() for n in names), "reset() left a state non-zero")
        again = step_logits(runner, tokens)
    err = _require_close(ref, got, "Core AI vs reference loop")
    _require(np.array_equal(got, again), "the same tokens after reset() give different logits")
    return f"max rel |Δ| {err:.1e} over {len(tokens)} steps, states {names}", None


def _check_strict(arch: Architecture, model: LoadedModel, checkpoint, work: Path, probe: str | None):
    from ssmport.loader.resolve import load_checkpoint

    if checkpoint is None:
        raise _Skip("no checkpoint given")
    checkpoint = Path(checkpoint)
    loaded = load_checkpoint(checkpoint)
    _require(loaded.architecture is arch, f"{checkpoint} loads as {loaded.architecture.name!r}")
    got = loaded.weights.shapes()
    want = arch.synthetic_weights(loaded.config, 0).shapes()
    _require(got == want, f"canonical names/shapes differ from the synthetic weights': {_dict_diff(got, want)}")
    for name in loaded.weights:  # every mapping and transform really runs
        t = loaded.weights[name]
        _require(tuple(t.shape) == got[name], f"{name}: reads as {list(t.shape)}, declared {list(got[name])}")

    tensors = _read_tensors(checkpoint)
    probe = probe or _default_probe(tensors)
    _require(probe in tensors, f"strict_probe {probe!r} is not in {checkpoint}")
    cases = {
        "missing": {n: t for n, t in tensors.items() if n != probe},
        "unexpected": tensors | {UNEXPECTED_TENSOR: torch.zeros(3)},
        "misshaped": tensors | {probe: torch.zeros(*tensors[probe].shape[:-1], tensors[probe].shape[-1] + 1)},
    }
    for case, mutated in cases.items():
        path = _write_like(checkpoint, mutated, work / case)
        named = UNEXPECTED_TENSOR if case == "unexpected" else probe
        try:
            load_checkpoint(path)
        except CheckpointError as exc:
            msg = str(exc)
            _require("\n" not in msg, f"{case} tensor: the error is not one line: {msg!r}")
            _require(named in msg, f"{case} tensor {named!r}: the error does not name it: {msg}")
        else:
            raise AssertionError(f"a checkpoint with a {case} tensor ({named}) loaded without an error")
    return f"{len(tensors)} tensors; probe {probe}", None


def _has_prefill(arch: Architecture, model: LoadedModel) -> bool:
    """Whether the architecture builds a prefill form for this model (asked, not guessed)."""
    from ssmport.quant import get_recipe
    from ssmport.quant.plan import WeightBuilder

    with torch.no_grad():
        decode = arch.build_decode(model.config, model.weights, WeightBuilder(get_recipe("fp32"), arch.keeps_float),
                                   torch.float32)  # fmt: skip
        return arch.build_prefill(model.config, decode, PREFILL_CHUNK) is not None


def _check_prefill(arch: Architecture, model: LoadedModel, tokens: list[int], out: Path):
    """Prefill (chunks of PREFILL_CHUNK, the last one padded) == the M=1 loop on Core AI:
    the logits after the last token and every state."""
    from ssmport.exporter.pipeline import export
    from ssmport.runtime import Runner

    if not _has_prefill(arch, model):
        raise _Skip("the architecture has no prefill form")
    result = export(model, out, quant="fp32", gate=False, progress=False, overwrite=True, prefill_chunk=PREFILL_CHUNK)
    _require(result.manifest.prefill, "build_prefill returns a module but the bundle has no prefill function")
    with Runner(result.path, prefill=True) as runner:
        names = runner.state_names
        _require(runner.has_prefill, "the runner does not use the bundle's prefill function")
        prefilled = runner.feed(tokens)
        after_prefill = {n: runner.state(n) for n in names}
        runner.reset()
        looped = step_logits(runner, tokens)[-1]
        after_loop = {n: runner.state(n) for n in names}
    err = _require_close(looped[None], prefilled[None], "prefill vs M=1 loop (logits after the last token)")
    for n in names:
        s_err = _rel_err(after_loop[n], after_prefill[n])
        _require(s_err <= FP32_REL_TOLERANCE, f"prefill vs M=1 loop: state {n} max rel |Δ| {s_err:.2e}")
    chunks = -(-len(tokens) // PREFILL_CHUNK)
    return f"{len(tokens)} tokens in {chunks} chunks of {PREFILL_CHUNK}: logits rel |Δ| {err:.1e}, states match", None


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------


def reference_logits(arch: Architecture, model: LoadedModel, tokens: list[int]) -> np.ndarray:
    """Logits [T, V] of the architecture's plain reference loop, one token at a time."""
    ref = arch.reference(model.config, model.weights)
    state = ref.zero_state()
    with torch.no_grad():
        rows = [ref.step(int(t), state).float().reshape(-1).numpy().copy() for t in tokens]
    return np.stack(rows)


def step_logits(runner, tokens: list[int]) -> np.ndarray:
    """Logits [T, V] after each token, fed one at a time through the M=1 function."""
    return np.stack([runner.step(int(t)) for t in tokens])


def _tokens(vocab: int, steps: int, seed: int) -> list[int]:
    ids = np.random.default_rng(seed).integers(0, vocab, size=steps).tolist()
    if steps >= 4:
        ids[2] = ids[3] = ids[1]  # a repeated token: the state must carry, not the input
    return ids


def _rel_err(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    _require(ref.shape == got.shape, f"logits shapes differ: {ref.shape} vs {got.shape}")
    return float(np.abs(ref - got).max() / max(1.0, np.abs(ref).max()))


def _require_close(ref: np.ndarray, got: np.ndarray, what: str) -> float:
    """fp32 parity: max |Δlogits| within FP32_REL_TOLERANCE of the logit scale and the same
    top-1 at every step. Returns the relative error."""
    err = _rel_err(ref, got)
    _require(err <= FP32_REL_TOLERANCE, f"{what}: max rel |Δlogits| {err:.2e} > {FP32_REL_TOLERANCE:g}")
    bad = np.flatnonzero(ref.argmax(-1) != got.argmax(-1))
    _require(not len(bad), f"{what}: top-1 differs at steps {bad.tolist()}")
    return err


def _dict_diff(got: dict, want: dict) -> str:
    parts = [f"missing {sorted(set(want) - set(got))[:5]}", f"extra {sorted(set(got) - set(want))[:5]}"]
    parts.append(f"shapes {[(n, got[n], want[n]) for n in got if n in want and got[n] != want[n]][:5]}")
    return "; ".join(parts)


def _default_probe(tensors: Mapping[str, torch.Tensor]) -> str:
    """A layer-1 tensor (rarely one a config is derived from), else the last name."""
    names = sorted(tensors)
    layer1 = [n for n in names if re.search(r"(^|\.)1\.", n) and tensors[n].dim() >= 1]
    return layer1[0] if layer1 else names[-1]


def _read_tensors(checkpoint: Path) -> dict[str, torch.Tensor]:
    from ssmport.loader.checkpoint import open_hf_weights, open_pth

    source = open_hf_weights(checkpoint) if checkpoint.is_dir() else open_pth(checkpoint)
    return {n: source[n].clone() for n in source}


def _write_like(checkpoint: Path, tensors: dict[str, torch.Tensor], target: Path) -> Path:
    """The tensors in the checkpoint's own format (an HF folder keeps its other files)."""
    if checkpoint.is_dir():
        from safetensors.torch import save_file

        weight_file = re.compile(r"(model.*\.safetensors|pytorch_model.*\.bin)(\.index\.json)?$")
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(checkpoint, target, ignore=lambda _, names: [n for n in names if weight_file.match(n)])
        save_file({n: t.contiguous() for n, t in tensors.items()}, str(target / "model.safetensors"))
        return target
    target.mkdir(parents=True, exist_ok=True)
    path = target / checkpoint.name
    torch.save(tensors, path)
    return path
