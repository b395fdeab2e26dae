"""What the LFM2, Granite-4.0-H, Nemotron-H and Falcon-H1 tests share: each family's fixture writer (with
transformers' own classes, tests/hybrid_files.py), its chat template over the fixture's marker
tokens, and the checks of an export against transformers."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import hybrid_files as hf
from ssmport.errors import CheckpointError
from ssmport.runtime import Runner
from ssmport.runtime.chat import ChatSession, ChatTemplate
from ssmport.loader.resolve import load_checkpoint
from ssmport.gate.torch_runner import TorchRunner

TOKENS = [3, 17, 5, 60, 9, 11, 2, 44, 80, 7, 30, 12, 12, 12, 91, 0]  # a repeat: the state must carry
CORE_AI_ATOL = 2e-3  # fp32 bundle vs transformers' fp32 torch path (the issue's bound)
EAGER_RTOL = 1e-4  # ssmport's fp32 torch module vs transformers: summation order only


@dataclass(frozen=True)
class Family:
    name: str  # the fixture's name in hybrid_files.write_all
    architecture: str  # ssmport's architecture name (model_type)
    chat: str  # hybrid_files.CHAT_TOKENS key
    write: object  # (folder) -> folder, with transformers' own class


FAMILIES = {
    "lfm2": Family("lfm2", "lfm2", "lfm2", lambda f: hf.write_lfm2(f, hf.Lfm2Dims(), seed=3)),
    "granite-h": Family("granite-h", "granitemoehybrid", "granite", lambda f: hf.write_granite_h(f, hf.GraniteDims(), seed=4)),
    "nemotron-h": Family("nemotron-h", "nemotron_h", "nemotron_h",
                         lambda f: hf.write_nemotron_h(f, hf.NemotronDims(), seed=5)),
    "falcon-h1": Family("falcon-h1", "falcon_h1", "falcon_h1", lambda f: hf.write_falcon_h1(f, hf.FalconDims(), seed=6)),
}  # fmt: skip


def chat_template(family: Family, tokenizer_json: Path) -> ChatTemplate:
    """The fixture's ChatML-style template (hybrid_files.write_tokenizer) as a ChatTemplate."""
    from tokenizers import Tokenizer

    start, end, eos = hf.CHAT_TOKENS[family.chat]
    return ChatTemplate(first_user=f"{start}user\n{{message}}{end}\n{start}assistant\n",
                        next_user=f"{end}\n{start}user\n{{message}}{end}\n{start}assistant\n",
                        stop_strings=(end,), eos_ids=(Tokenizer.from_file(str(tokenizer_json)).token_to_id(eos),))  # fmt: skip


def with_config(model, **changes):
    """A LoadedModel with config fields replaced (a multiplier ignored, a convention swapped)."""
    return replace(model, config=replace(model.config, **changes))


def eager_logits(model, tokens: list[int]) -> np.ndarray:
    """ssmport's fp32 export-form module in torch, one token at a time: [T, V]."""
    runner = TorchRunner(model, "fp32")
    try:
        return np.stack([runner.step(t) for t in tokens])
    finally:
        runner.close()


def assert_close_to(ours: np.ndarray, theirs: torch.Tensor | np.ndarray, rtol: float = EAGER_RTOL) -> None:
    """max |Δ| within rtol of the logit scale, and the same top-1 at every step."""
    theirs = np.asarray(theirs)
    err = np.abs(ours - theirs).max()
    assert err <= rtol * max(1.0, np.abs(theirs).max()), f"max |Δlogits| {err:.3g}"
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


def differs(ours: np.ndarray, theirs, at_least: float = 1e-3) -> bool:
    """Apart by more than `at_least` somewhere: 10x the parity bound at these logit scales (~3)."""
    return float(np.abs(ours - np.asarray(theirs)).max()) > at_least


def tensors_of(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            out |= {k: h.get_tensor(k) for k in h.keys()}
    return out


def rewrite(folder: Path, dst: Path, tensors: dict[str, torch.Tensor] | None = None, config_edit=None) -> Path:
    """A copy of a fixture folder with other tensors and/or an edited config.json."""
    shutil.copytree(folder, dst, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json"))
    save_file({k: v.contiguous() for k, v in (tensors if tensors is not None else tensors_of(folder)).items()},
              str(dst / "model.safetensors"), metadata={"format": "pt"})  # fmt: skip
    if config_edit is not None:
        config = json.loads((dst / "config.json").read_text())
        config_edit(config)
        (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def assert_config_refused(folder: Path, dst: Path, edit, says: str) -> None:
    """The folder with its config.json edited by `edit` is refused by loading, in one line
    that contains `says`."""
    bad = rewrite(folder, dst, config_edit=edit)
    try:
        load_checkpoint(bad)
    except CheckpointError as exc:
        assert says in str(exc) and "\n" not in str(exc)
    else:
        raise AssertionError(f"the edited config was loaded; expected a refusal saying {says!r}")


def eager_prefill_logits(model, tokens: list[int]) -> np.ndarray:
    """The last logits [V] of ssmport's fp32 prefill module in torch, the tokens fed in chunks
    of prefill_checks.CHUNK at their positions (the last chunk padded)."""
    from prefill_checks import CHUNK, eager_modules

    module = eager_modules(model)[1]
    with torch.no_grad():
        for start in range(0, len(tokens), CHUNK):
            part = tokens[start : start + CHUNK]
            ids = torch.zeros(1, CHUNK, dtype=torch.int32)
            ids[0, : len(part)] = torch.tensor(part)
            positions = torch.arange(start, start + CHUNK, dtype=torch.int32).view(1, CHUNK)
            logits = module(ids, positions, torch.tensor([len(part)], dtype=torch.int32))
    return logits.reshape(-1).numpy()


def assert_chat_reuses_and_rewinds(bundle_path: Path, tokenizer, template: ChatTemplate) -> int:
    """Turn 2 feeds only the new turn (turn 1's state, KV rows or rings included, is reused)
    and its reply equals a cold run over the whole transcript; a different turn 2 rewinds to
    the turn-1 snapshot. Returns turn 1's length in tokens."""
    with Runner(bundle_path) as runner, Runner(bundle_path) as cold_runner:
        session = ChatSession(runner, tokenizer, template)
        "".join(session.send("hello world", max_tokens=5))
        history = list(session.transcript)
        assert runner.tokens == history
        turn2 = history + tokenizer.encode(template.user_turn("how are you", first=False))
        warm = "".join(session.generate(turn2, max_tokens=5))
        assert session.last.reused_tokens == len(history) and not session.last.restored
        assert session.last.fed_tokens == len(turn2) - len(history)
        cold = ChatSession(cold_runner, tokenizer, template)
        assert "".join(cold.generate(turn2, max_tokens=5)) == warm and cold.transcript == session.transcript

        other = history + tokenizer.encode(template.user_turn("the state of a model", first=False))
        rewound = session.prefill_to(other)
        assert session.last.restored and session.last.reused_tokens == len(history)
        cold_runner.reset()
        assert np.abs(rewound - cold_runner.feed(other)).max() <= 1e-4
    return len(history)
