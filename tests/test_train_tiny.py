"""tools/: the trainer of rwkv7-pydoc computes what ssmport exports, the trainer of the tests'
LFM2-MoE writes a folder ssmport loads, and the data tool splits files as documented. (The
tools run without ssmport; these tests tie them to it.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))

import pydoc_corpus  # noqa: E402
import train_tiny  # noqa: E402
from rwkv7_trainable import RWKV7, Dims  # noqa: E402

# Not square anywhere that matters: 3 heads of 32, FFN 160, LoRA ranks all different.
SMALL = Dims(vocab=320, width=96, layers=3, head=32, ffn=160, decay_lora=16, a_lora=24, v_lora=8, gate_lora=32)


def perturbed_model(seed: int) -> RWKV7:
    """The trainer's model with every parameter moved off its (partly zero) initial value."""
    torch.manual_seed(seed)
    model = RWKV7(SMALL)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p) * max(float(p.std()) if p.numel() > 1 else 0.0, 0.3))
    return model.eval()


def test_trainer_forward_is_ssmports_reference(tmp_path):
    """The parallel training forward over a sequence equals ssmport's plain reference step,
    run token by token on the saved state dict, loaded by the strict BlinkDL loader."""
    from ssmport.loader.resolve import load_checkpoint

    model = perturbed_model(seed=3)
    ids = torch.randint(0, SMALL.vocab, (1, 24), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        parallel = model(ids)[0]
    path = tmp_path / "trained.pth"
    torch.save(model.state_dict(), path)
    loaded = load_checkpoint(path)
    reference = loaded.architecture.reference(loaded.config, loaded.weights)
    state = reference.zero_state()
    stepped = torch.stack([reference.step(int(t), state) for t in ids[0]])
    assert loaded.config.num_heads == 3 and loaded.config.gate_lora == 32
    assert torch.allclose(parallel, stepped, atol=1e-4 * float(stepped.abs().max()), rtol=0)


def write_stream(path: Path, n: int, seed: int) -> None:
    ids = np.random.default_rng(seed).integers(1, 257, n).astype("<u2")
    ids[0] = pydoc_corpus.END_OF_TEXT
    ids.tofile(path)


def test_training_run_on_cpu_writes_a_loadable_checkpoint_and_log(tmp_path):
    from ssmport.loader.resolve import load_checkpoint

    data = tmp_path / "data"
    data.mkdir()
    write_stream(data / "train.u16", 4000, seed=1)
    write_stream(data / "validation.u16", 300, seed=2)
    dims = [f"--{k.replace('_', '-')}={v}" for k, v in SMALL.to_json().items()]
    argv = ["--data", str(data), "--out", str(tmp_path / "run"), "--steps", "3", "--batch", "2", "--ctx", "32",
            "--warmup", "1", "--eval-every", "2", "--log-every", "1", "--device", "cpu", *dims]  # fmt: skip
    assert train_tiny.main(argv) == 0
    log = [json.loads(line) for line in (tmp_path / "run" / train_tiny.LOG).read_text().splitlines()]
    assert log[0]["event"] == "start" and log[0]["dims"] == SMALL.to_json()
    assert [e["step"] for e in log if "loss" in e] == [0, 1, 2]
    assert any("val_loss" in e for e in log[1:-1]) and log[-1]["event"] == "end"
    loaded = load_checkpoint(tmp_path / "run" / train_tiny.CHECKPOINT)  # strict BlinkDL load
    assert loaded.config.hidden_size == SMALL.width and loaded.config.num_layers == SMALL.layers


def test_corpus_split_holds_out_whole_files_from_the_tail():
    docs = {f"dir/file{i}.rst.txt": bytes([65 + i % 26]) * (100 + 37 * i) for i in range(40)}
    train, held = pydoc_corpus.split(docs)
    assert sorted(train + held) == sorted(docs) and not set(train) & set(held)
    order = sorted(docs, key=lambda p: pydoc_corpus.sha256(p.encode()))
    assert order[-len(held) :] == held
    total, held_bytes = sum(map(len, docs.values())), sum(len(docs[p]) for p in held)
    assert held_bytes >= pydoc_corpus.VALIDATION_FRACTION * total
    assert held_bytes - len(docs[held[0]]) < pydoc_corpus.VALIDATION_FRACTION * total  # no more than needed


def test_corpus_encoding_is_end_of_text_then_bytes_plus_one():
    ids = pydoc_corpus.encode({"a": b"Hi", "b": b"\xff"}, ["a", "b"])
    assert ids.tolist() == [0, ord("H") + 1, ord("i") + 1, 0, 256]


@pytest.mark.parametrize("step, expected", [(0, 0.5e-3), (3, 2e-3), (103, 1e-4)])
def test_learning_rate_warms_up_then_decays_to_the_final_rate(step, expected):
    args = train_tiny.parse_args(["--data", ".", "--out", ".", "--steps", "103", "--warmup", "4", "--lr", "2e-3",
                                  "--final-lr", "1e-4"])  # fmt: skip
    assert train_tiny.learning_rate(step, args) == pytest.approx(expected)


def test_moe_training_run_writes_a_folder_ssmport_loads_with_its_byte_vocab(tmp_path):
    """tools/train_moe.py: a few CPU steps of transformers' LFM2-MoE write a save_pretrained
    folder (fp16) that ssmport loads strictly with the byte vocab next to it, and the load
    balancer moved the expert bias."""
    import train_moe
    from safetensors.torch import load_file
    from ssmport.loader.resolve import load_model

    data = tmp_path / "data"
    data.mkdir()
    write_stream(data / "train.u16", 4000, seed=1)
    write_stream(data / "validation.u16", 300, seed=2)
    out = tmp_path / "run"
    argv = ["--data", str(data), "--out", str(out), "--steps", "3", "--batch", "2", "--ctx", "16", "--warmup", "1",
            "--eval-every", "0", "--device", "cpu", "--family", "lfm2_moe", "--set", "hidden_size=64",
            "--set", "num_hidden_layers=3", "--set", 'layer_types=["conv", "full_attention", "conv"]',
            "--set", "num_dense_layers=1", "--set", "intermediate_size=96", "--set", "num_experts=4",
            "--set", "moe_intermediate_size=32", "--balance-rate", "0.01"]  # fmt: skip
    assert train_moe.main(argv) == 0
    log = [json.loads(line) for line in (out / train_moe.LOG).read_text().splitlines()]
    assert log[0]["config"]["num_experts"] == 4 and log[-2]["event"] == "end" and log[-1]["event"] == "expert_shares"
    assert 2.0 < log[0]["unigram_val_loss"] < 6.0  # ~log(256) on uniform random bytes
    weights = load_file(out / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.float16}
    bias = weights["model.layers.1.feed_forward.expert_bias"]
    assert bias.abs().max() > 0  # three steps of +-0.01
    model = load_model(str(out))  # strict HF load
    assert model.architecture.name == "lfm2_moe" and model.config.moe.experts == 4
    assert model.vocab_path.name == "vocab.tsv"
