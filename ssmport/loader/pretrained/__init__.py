"""Models whose trained weights ship inside ssmport (package data), and their held-out text.

`rwkv7-pydoc`: a 3.6M-parameter byte-level RWKV-7 (L4 C256) trained with
tools/train_tiny.py on the Python 3.11 documentation sources (Debian's python3.11-doc,
PSF License); rwkv7_pydoc/README.md is its model card. Its `.pth` is a plain BlinkDL
checkpoint, loaded strictly like any other; its `vocab.tsv` (the 256 single bytes as ids
1..256, id 0 end of text: the first 256 entries of the World vocab) sits next to it, so the
usual lookup finds it. `validation.txt` is a paragraph of a held-out file (one the training
never saw) that `ssmport export` scores each bundle of it on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_HERE = Path(__file__).parent


@dataclass(frozen=True)
class BundledModel:
    preset: str
    checkpoint: Path
    validation_text: Path  # held-out text, scored from a zero state
    # nats/byte of the fp32 model on validation_text (the `rwkv` package's RWKV_x070, cpu
    # fp32; tests/test_trained_rwkv7.py recomputes it), and on the whole held-out split
    # (tools/rwkv7_pydoc/train_log.jsonl, last line)
    reference_loss: float
    split_loss: float
    chat: bool = False  # trained on a chat format; otherwise `ssmport chat` continues the text


BUNDLED = {
    m.preset: m
    for m in (
        BundledModel(
            preset="rwkv7-pydoc",
            checkpoint=_HERE / "rwkv7_pydoc" / "rwkv7-pydoc.pth",
            validation_text=_HERE / "rwkv7_pydoc" / "validation.txt",
            reference_loss=1.0022,
            split_loss=0.9455,
        ),
    )
}


def bundled_checkpoint(preset: str) -> Path | None:
    """The shipped weights of a preset, or None (its weights must be given)."""
    model = BUNDLED.get(preset)
    return model.checkpoint if model else None


def bundled_model_of(provenance: dict) -> BundledModel | None:
    """The shipped model a bundle (or LoadedModel) was exported from, by its provenance."""
    model = BUNDLED.get(provenance.get("preset"))
    if model is None or provenance.get("kind") != "pth":
        return None
    return model if Path(provenance.get("path", "")).resolve() == model.checkpoint.resolve() else None


def mean_nats(logits: np.ndarray, targets: list[int]) -> float:
    """Mean cross-entropy (nats) of rows `logits` [T, V] against the next ids `targets` [T]."""
    rows = logits.astype(np.float64)
    top = rows.max(axis=1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(rows - top).sum(axis=1))
    return float(np.mean(log_z - rows[np.arange(len(targets)), targets]))


def validation_loss(
    model: BundledModel, step_each: Callable[[list[int]], np.ndarray], tokenize: Callable[[str], list[int]]
) -> tuple[float, int]:
    """(nats per byte, bytes scored) of the held-out text under a runner's `step_each`
    (from a zero state, one state carried through, every byte after the first predicted)."""
    ids = tokenize(model.validation_text.read_text(encoding="utf-8"))
    return mean_nats(step_each(ids[:-1]), ids[1:]), len(ids) - 1
