"""Turn what the user typed (a preset name, a `.pth`, an HF folder, a Hub repo) into a LoadedModel."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

from ssmport.architectures import Architecture, LoadedModel, architectures, get_architecture, presets
from ssmport.loader.checkpoint import open_hf_weights, open_pth
from ssmport.errors import CheckpointError, SsmportError
from ssmport.files import missing_file
from ssmport.loader.pretrained import bundled_checkpoint
from ssmport.strict_json import loads_finite

DEFAULT_SEED = 0
PLUGIN_HINT = "an architecture from outside ssmport is loaded with --plugin FILE or SSMPORT_PLUGINS"


def load_model(
    spec: str,
    weights: str | Path | None = None,
    synthetic: bool = False,
    seed: int = DEFAULT_SEED,
    vocab: str | Path | None = None,
    file: str | None = None,
    display=None,
) -> LoadedModel:
    """Resolve `spec` to a model ready to build: a preset name (its checkpoint downloaded
    unless `weights` or `synthetic`), a checkpoint path, or a Hugging Face Hub repo
    `org/repo` (`file`: which .pth in it). Presets and repos take `@revision`. `display`
    shows download progress (`ssmport.progress.Stages`).

    The tokenizer is, in order: `vocab`, a World vocab or `tokenizer.json` next to the
    checkpoint, or the architecture's default for this config (RWKV World models: the
    bundled vocab).
    """
    model = _resolve(spec, weights, synthetic, seed, file, display)
    if vocab is not None:
        path = Path(vocab).expanduser()
        if not path.is_file():
            raise SsmportError(f"--vocab {vocab}: {'a directory, not a vocab file' if path.is_dir() else missing_file(path)}")
        model.vocab_path, model.vocab_origin = path, "--vocab"
    elif model.vocab_path is None:
        default = model.architecture.default_vocab(model.config)
        if default is not None:
            model.vocab_path, model.vocab_origin = default
    if model.vocab_path is not None:
        _check_vocab_fits(model)
    return model


def source_paths(model: LoadedModel) -> list[Path]:
    """The files an export of `model` reads (its checkpoint, its vocab): what --overwrite must
    never replace."""
    paths = [Path(p) for p in (model.provenance.get("path"), model.vocab_path) if p]
    return paths


def _check_vocab_fits(model: LoadedModel) -> None:
    """A vocab whose ids exceed the embedding cannot be this model's: an explicit --vocab is
    an error, one merely found next to the checkpoint is left out (with a note)."""
    from ssmport.tokenizers import tokenizer_vocab_size

    top = tokenizer_vocab_size(model.vocab_path) - 1
    if top < model.config.vocab_size:
        return
    problem = f"{model.vocab_path}: vocab ids reach {top}, beyond the model's {model.config.vocab_size}-row embedding"
    if model.vocab_origin == "--vocab":
        raise SsmportError(problem)
    model.notes.append(f"{problem}; the bundle gets no tokenizer (pass --vocab to give one)")
    model.vocab_path = model.vocab_origin = None


def _resolve(spec: str, weights, synthetic: bool, seed: int, file: str | None, display) -> LoadedModel:
    from ssmport.loader import hub

    known = presets()
    local = spec not in known and _exists(Path(spec).expanduser())
    name, revision = (spec, None) if spec in known or local else hub.split_revision(spec)
    if name in known:
        preset = known[name]
        arch = get_architecture(preset.architecture)
        if weights is not None and synthetic:
            raise SsmportError("pass either --weights or --synthetic, not both")
        if file is not None:
            raise SsmportError(f"--file goes with a Hub repo name; preset {name} has its own source (see `ssmport list`)")
        if revision is not None and (weights is not None or synthetic or preset.hub is None):
            raise SsmportError(f"{spec}: a revision picks what is downloaded; {name} downloads nothing here")
        if weights is None and not synthetic:
            weights = bundled_checkpoint(preset.name)  # a preset whose weights ship with ssmport
        if weights is not None:
            return _as_preset(load_checkpoint(Path(weights)), preset)
        if synthetic or not preset.released:
            config = arch.config_from_json(dict(preset.config))
            return LoadedModel(
                architecture=arch,
                config=config,
                weights=arch.synthetic_weights(config, seed),
                provenance={"kind": "synthetic", "preset": preset.name, "seed": seed},
                name=preset.name,
            )
        if preset.hub is None:
            raise SsmportError(
                f"{spec} has no download source: pass --weights PATH (a checkpoint file or a Hugging Face "
                f"folder), or --synthetic for deterministic random weights"
            )
        source = preset.hub
        return _as_preset(_from_hub(source.repo, revision or source.revision, source.file, display), preset)
    if synthetic:
        raise SsmportError(f"--synthetic needs a preset name (see `ssmport list`), not {spec!r}")
    if weights is not None:
        raise SsmportError("--weights goes with a preset name; give the checkpoint path directly instead")
    if local:
        if file is not None:
            raise SsmportError("--file goes with a Hub repo name; give the local checkpoint's path directly")
        return load_checkpoint(Path(spec).expanduser())
    if hub.is_repo_id(name):
        return _from_hub(name, revision, file, display)
    raise SsmportError(f"{spec!r} is neither a preset (see `ssmport list`), an existing path, nor a Hub repo (org/name)")


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long to be a path, say: then it is not one
        return False


def _as_preset(model: LoadedModel, preset) -> LoadedModel:
    _check_matches_preset(model, preset)
    model.name = preset.name
    model.provenance["preset"] = preset.name
    return model


def _from_hub(repo: str, revision: str | None, file: str | None, display=None) -> LoadedModel:
    from ssmport.loader import hub

    fetched = hub.fetch(repo, revision, file, check_config=_claimed_config, display=display)
    model = load_checkpoint(fetched.path)
    model.provenance["hub"] = fetched.provenance
    model.notes.extend(fetched.notes)
    model.name = _slug(fetched.path.stem if fetched.path.is_file() else repo.rpartition("/")[2])
    return model


def load_checkpoint(path: Path) -> LoadedModel:
    path = path.expanduser()
    if path.is_dir():
        return _load_hf_folder(path)
    if not path.is_file():
        raise SsmportError(f"{path}: {missing_file(path, 'no such file or directory')}")
    if path.suffix == ".safetensors":
        raise SsmportError(f"{path}: give the Hugging Face folder (with config.json), not a single shard")
    source = open_pth(path)
    for arch in architectures():
        if arch.matches_pth(source):
            return _loaded(arch, *arch.load_pth(source), "pth", path, path.stem, path.parent)
    raise CheckpointError(f"{path}: no registered architecture recognises this checkpoint's tensor names ({PLUGIN_HINT})")


def _load_hf_folder(folder: Path) -> LoadedModel:
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{folder}: not a Hugging Face model folder (no config.json)")
    config_json = _read_config(cfg_path)
    arch = _hf_architecture(config_json, folder)
    config, weights = arch.load_hf(config_json, open_hf_weights(folder))
    return _loaded(arch, config, weights, "hf", folder, folder.name, folder)


MAX_CONFIG_BYTES = 16 << 20  # config.json files are a few KB


def _read_config(cfg_path: Path) -> dict[str, Any]:
    try:
        if cfg_path.stat().st_size > MAX_CONFIG_BYTES:
            raise ValueError(f"{cfg_path.stat().st_size:,} bytes; a config.json is at most {MAX_CONFIG_BYTES >> 20} MB")
        config_json = loads_finite(cfg_path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise CheckpointError(f"{cfg_path}: cannot read ({exc.strerror})") from None
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
        raise CheckpointError(f"{cfg_path}: invalid JSON ({exc})") from None
    if not isinstance(config_json, dict):
        raise CheckpointError(f"{cfg_path}: expected a JSON object")
    return config_json


def _claimed_config(cfg_path: Path, where: str) -> Architecture:
    """The architecture a Hub repo's config.json belongs to (checked before its weights come)."""
    return _hf_architecture(_read_config(cfg_path), where)


def _hf_architecture(config_json: dict[str, Any], where) -> Architecture:
    """The registered architecture that claims a folder's config.json."""
    for arch in architectures():
        if arch.matches_hf_config(config_json):
            return arch
    raise CheckpointError(
        f"{where}: model_type {config_json.get('model_type')!r} is not supported; available: "
        + ", ".join(a.name for a in architectures())
        + f" ({PLUGIN_HINT})"
    )


def _check_matches_preset(model: LoadedModel, preset) -> None:
    if model.architecture.name != preset.architecture:
        raise CheckpointError(
            f"{model.provenance.get('path')}: is {model.architecture.name}, but preset {preset.name} is {preset.architecture}"
        )
    got = json.loads(json.dumps(model.config.to_json()))  # as the manifest holds it (lists, not tuples)
    want = json.loads(json.dumps(dict(preset.config)))  # the same form: a preset may spell a list as a tuple
    diffs = [f"{k}={got[k]} (preset {want[k]})" for k in model.architecture.preset_keys
             if k in want and got.get(k) != want[k]]
    if diffs:
        raise CheckpointError(f"{model.provenance.get('path')}: does not match preset {preset.name}: {', '.join(diffs)}")


def skipped_note(skipped: dict[str, dict]) -> str:
    """The one line of output naming the groups of tensors left out ({"prefix*": {what, tensors}})."""
    groups = ", ".join(f"{p} ({g['what']}, {g['tensors']})" for p, g in skipped.items())
    total = sum(g["tensors"] for g in skipped.values())
    return f"left out {total} checkpoint tensors that are not part of the language model: {groups}"


def _loaded(arch, config, weights, kind: str, path: Path, name: str, vocab_dir: Path) -> LoadedModel:
    from ssmport.tokenizers import find_tokenizer

    vocab = find_tokenizer(vocab_dir)
    provenance: dict[str, Any] = {"kind": kind, "path": str(path.resolve()), PROBE_KEY: weights_probe(weights)}
    notes = []
    if weights.skipped:  # named in the manifest (source) and in one line of output (notes)
        provenance["skipped_tensors"] = {f"{p}*": {"what": what, "tensors": n} for p, (what, n) in weights.skipped.items()}
        notes.append(skipped_note(provenance["skipped_tensors"]))
    return LoadedModel(
        architecture=arch,
        config=config,
        weights=weights,
        provenance=provenance,
        vocab_path=vocab,
        vocab_origin="next to checkpoint" if vocab else None,
        name=_slug(name),
        notes=notes,
    )


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "model"


def with_context(model: LoadedModel, context: int) -> LoadedModel:
    """The model with its KV cache sized for `context` positions (export's --context), recorded
    in its provenance so that a rebuilt source (gate, bench) gets the same cache."""
    config = model.architecture.with_context(model.config, context)
    return dataclasses.replace(model, config=config, provenance={**model.provenance, "context": context})
# A few values of a few small tensors, recorded at export: `--weights` for a gate or torch
# logits must be the bundle's own model, not merely one of the same shape. Compared with a
# tolerance, so a bf16 or fp16 copy of the same checkpoint (or another layout of it) passes.
PROBE_KEY = "weights_probe"
_PROBE_TENSORS, _PROBE_VALUES, _PROBE_MAX_NUMEL = 4, 8, 1 << 14


def weights_probe(weights) -> dict[str, list[float]]:
    """{canonical name: first values} of the smallest tensors (norms, biases: cheap to read)."""
    small = sorted((math.prod(weights.shape(n)), n) for n in weights if math.prod(weights.shape(n)) <= _PROBE_MAX_NUMEL)
    return {n: [float(f"{v:.6g}") for v in weights[n].reshape(-1)[:_PROBE_VALUES].tolist()]
            for _, n in small[:_PROBE_TENSORS]}  # fmt: skip


def _probe_differs(recorded: dict, weights) -> str | None:
    """The first recorded tensor whose values `weights` do not reproduce, or None."""
    for name, values in recorded.items():
        if name not in weights:
            return name
        got = weights[name].reshape(-1)[: len(values)].tolist()
        if len(got) != len(values) or not all(math.isclose(a, b, rel_tol=2e-2, abs_tol=2e-3) for a, b in zip(got, values)):
            return name
    return None


def rebuild_bundle_source(manifest, weights: str | Path | None = None) -> LoadedModel:
    """The fp32 source of a bundle (see `rebuild_source`), refused unless it is the bundle's
    own model: the same architecture and config, and (recorded since this check exists) the
    same values in a few small tensors."""
    plugin = manifest.source.get("plugin")
    if plugin and manifest.architecture not in {a.name for a in architectures()}:
        raise SsmportError(f"this bundle's architecture {manifest.architecture!r} is registered by the plugin {plugin}: "
                           f"pass --plugin {plugin} (or name it in SSMPORT_PLUGINS)")  # fmt: skip
    model = rebuild_source(manifest.source, weights)
    where = f"--weights {weights}" if weights is not None else f"the source checkpoint {manifest.source.get('path')}"
    if model.architecture.name != manifest.architecture:
        raise SsmportError(f"{where} is a {model.architecture.name} model, but the bundle is {manifest.architecture}")
    got = json.loads(json.dumps(model.config.to_json()))  # as the manifest holds it (lists, not tuples)
    diffs = [f"{k}={got.get(k)!r} (bundle {v!r})" for k, v in manifest.config.items() if got.get(k) != v]
    if diffs:
        shown = ", ".join(diffs[:4]) + (f" and {len(diffs) - 4} more" if len(diffs) > 4 else "")
        raise SsmportError(f"{where} is not the model this bundle was exported from: {shown}")
    probe = manifest.source.get(PROBE_KEY)
    if isinstance(probe, dict) and not model.synthetic:
        name = _probe_differs(probe, model.weights)
        if name is not None:
            raise SsmportError(f"{where} is not the checkpoint this bundle was exported from: tensor {name} holds "
                               "other values (same shapes, other weights)")  # fmt: skip
    return model


def rebuild_source(provenance: dict[str, Any], weights: str | Path | None = None) -> LoadedModel:
    """Reload the fp32 source a bundle was exported from (for gates and torch logits)."""
    model = _rebuild_source(provenance, weights)
    if "context" in provenance:
        model = with_context(model, int(provenance["context"]))
    return model


def _rebuild_source(provenance: dict[str, Any], weights: str | Path | None) -> LoadedModel:
    if weights is not None:
        return load_checkpoint(Path(weights))
    kind = provenance.get("kind")
    if kind == "synthetic":
        if provenance.get("preset") not in presets():
            raise SsmportError(
                f"this bundle was exported from preset {provenance.get('preset')!r}, which is not registered "
                f"(an architecture from outside ssmport? {PLUGIN_HINT})"
            )
        return load_model(provenance["preset"], synthetic=True, seed=int(provenance.get("seed", DEFAULT_SEED)))
    path = provenance.get("path")
    if (not path or not Path(path).exists()) and "hub" in provenance:  # gone from the cache: fetch it again
        source = provenance["hub"]
        return _from_hub(source["repo"], source["commit"], source.get("file"))
    if not path:
        raise SsmportError(f"the bundle's manifest records no source checkpoint (source kind {kind!r}); "
                           "pass --weights PATH to compare against one")  # fmt: skip
    if not _exists(Path(path)):
        raise SsmportError(
            f"the source checkpoint this bundle was exported from ({path}) is not available; "
            "pass --weights PATH to compare against it"
        )
    return load_checkpoint(Path(path))
