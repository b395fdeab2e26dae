"""Turn what the user typed (a preset name, a `.pth`, an HF folder) into a LoadedModel."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ssmport.architectures import LoadedModel, architectures, get_architecture, presets
from ssmport.checkpoint import open_hf_weights, open_pth
from ssmport.errors import CheckpointError, SsmportError

DEFAULT_SEED = 0
# Dimensions a checkpoint must share with the preset it is given for (LoRA ranks are read
# from the weights, so they may differ).
_PRESET_KEYS = ("vocab_size", "hidden_size", "num_layers", "head_size", "ffn_size",  # RWKV-7
                "num_heads", "head_dim", "num_v_heads", "head_v_dim", "intermediate_size")  # Gated DeltaNet


def load_model(
    spec: str,
    weights: str | Path | None = None,
    synthetic: bool = False,
    seed: int = DEFAULT_SEED,
    vocab: str | Path | None = None,
) -> LoadedModel:
    """Resolve `spec` (preset name or checkpoint path) to a model ready to build.

    The tokenizer vocab is, in order: `vocab`, a vocab file next to the checkpoint, or
    the architecture's default for this config (RWKV World models: the bundled vocab).
    """
    model = _resolve(spec, weights, synthetic, seed)
    if vocab is not None:
        path = Path(vocab).expanduser()
        if not path.is_file():
            raise SsmportError(f"--vocab {vocab}: no such file")
        model.vocab_path, model.vocab_origin = path, "--vocab"
    elif model.vocab_path is None:
        default = model.architecture.default_vocab(model.config)
        if default is not None:
            model.vocab_path, model.vocab_origin = default
    if model.vocab_path is not None:
        _check_vocab_fits(model)
    return model


def _check_vocab_fits(model: LoadedModel) -> None:
    """A vocab whose ids exceed the embedding cannot be this model's: an explicit --vocab is
    an error, one merely found next to the checkpoint is left out (with a note)."""
    from ssmport.tokenizers import WorldTokenizer

    top = WorldTokenizer.from_file(model.vocab_path).vocab_size - 1
    if top < model.config.vocab_size:
        return
    problem = f"{model.vocab_path}: vocab ids reach {top}, beyond the model's {model.config.vocab_size}-row embedding"
    if model.vocab_origin == "--vocab":
        raise SsmportError(problem)
    model.notes.append(f"{problem}; the bundle gets no tokenizer (pass --vocab to give one)")
    model.vocab_path = model.vocab_origin = None


def _resolve(spec: str, weights, synthetic: bool, seed: int) -> LoadedModel:
    known = presets()
    if spec in known:
        preset = known[spec]
        arch = get_architecture(preset.architecture)
        if weights is not None and synthetic:
            raise SsmportError("pass either --weights or --synthetic, not both")
        if weights is not None:
            model = load_checkpoint(Path(weights))
            _check_matches_preset(model, preset)
            model.name = preset.name
            model.provenance["preset"] = preset.name
            return model
        if synthetic or not preset.released:
            config = arch.config_from_json(dict(preset.config))
            return LoadedModel(
                architecture=arch,
                config=config,
                weights=arch.synthetic_weights(config, seed),
                provenance={"kind": "synthetic", "preset": preset.name, "seed": seed},
                name=preset.name,
            )
        raise SsmportError(
            f"{spec} needs its weights: pass --weights PATH (a BlinkDL .pth or a Hugging Face "
            f"folder), or --synthetic for deterministic random weights (nothing is downloaded)"
        )
    if synthetic:
        raise SsmportError(f"--synthetic needs a preset name (see `ssmport list`), not {spec!r}")
    if weights is not None:
        raise SsmportError("--weights goes with a preset name; give the checkpoint path directly instead")
    path = Path(spec).expanduser()
    if not path.exists():
        raise SsmportError(f"{spec!r} is neither a preset (see `ssmport list`) nor an existing path")
    return load_checkpoint(path)


def load_checkpoint(path: Path) -> LoadedModel:
    path = path.expanduser()
    if path.is_dir():
        return _load_hf_folder(path)
    if not path.is_file():
        raise SsmportError(f"{path}: no such file or directory")
    if path.suffix == ".safetensors":
        raise SsmportError(f"{path}: give the Hugging Face folder (with config.json), not a single shard")
    source = open_pth(path)
    for arch in architectures():
        if arch.matches_pth(source):
            return _loaded(arch, *arch.load_pth(source), "pth", path, path.stem, path.parent)
    raise CheckpointError(f"{path}: no registered architecture recognises this checkpoint's tensor names")


def _load_hf_folder(folder: Path) -> LoadedModel:
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{folder}: not a Hugging Face model folder (no config.json)")
    try:
        config_json: dict[str, Any] = json.loads(cfg_path.read_text())
    except ValueError as exc:
        raise CheckpointError(f"{cfg_path}: invalid JSON ({exc})") from None
    model_type = config_json.get("model_type")
    hf_arch = set(config_json.get("architectures") or [])
    for arch in architectures():
        if model_type == arch.name or hf_arch & set(arch.hf_architectures):
            config, weights = arch.load_hf(config_json, open_hf_weights(folder))
            return _loaded(arch, config, weights, "hf", folder, folder.name, folder)
    raise CheckpointError(
        f"{folder}: model_type {model_type!r} is not supported; available: "
        + ", ".join(a.name for a in architectures())
    )


def _check_matches_preset(model: LoadedModel, preset) -> None:
    if model.architecture.name != preset.architecture:
        raise CheckpointError(
            f"{model.provenance.get('path')}: is {model.architecture.name}, but preset {preset.name} is {preset.architecture}"
        )
    got = model.config.to_json()
    diffs = [f"{k}={got[k]} (preset {preset.config[k]})" for k in _PRESET_KEYS if k in preset.config and got.get(k) != preset.config[k]]
    if diffs:
        raise CheckpointError(f"{model.provenance.get('path')}: does not match preset {preset.name}: {', '.join(diffs)}")


def _loaded(arch, config, weights, kind: str, path: Path, name: str, vocab_dir: Path) -> LoadedModel:
    from ssmport.tokenizers import find_vocab

    vocab = find_vocab(vocab_dir)
    return LoadedModel(
        architecture=arch,
        config=config,
        weights=weights,
        provenance={"kind": kind, "path": str(path.resolve())},
        vocab_path=vocab,
        vocab_origin="next to checkpoint" if vocab else None,
        name=_slug(name),
    )


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "model"


def rebuild_source(provenance: dict[str, Any], weights: str | Path | None = None) -> LoadedModel:
    """Reload the fp32 source a bundle was exported from (for gates and torch logits)."""
    if weights is not None:
        return load_checkpoint(Path(weights))
    kind = provenance.get("kind")
    if kind == "synthetic":
        return load_model(provenance["preset"], synthetic=True, seed=int(provenance.get("seed", DEFAULT_SEED)))
    path = provenance.get("path")
    if not path or not Path(path).exists():
        raise SsmportError(
            f"the source checkpoint this bundle was exported from ({path}) is not available; "
            "pass --weights PATH to compare against it"
        )
    return load_checkpoint(Path(path))
