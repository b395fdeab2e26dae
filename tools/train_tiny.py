"""Train the small byte-level RWKV-7 that ships with ssmport as `rwkv7-pydoc`.

    python tools/pydoc_corpus.py python3.11-doc_3.11.2-6+deb12u8_all.deb --out data/
    python tools/train_tiny.py --data data/ --out run/            # the shipped run's settings

Trains `rwkv7_trainable.RWKV7` on random windows of the training stream (every window from a
zero state, as ssmport's bundles start), AdamW with a linear warm-up and a cosine decay,
and writes to --out:

  rwkv7-pydoc.pth     the weights in BlinkDL's x070 layout, fp16 (what ships)
  train_log.jsonl     the run: settings, hardware, the loss curve, validation losses, seconds

Validation loss is the mean cross-entropy in nats per byte over the whole held-out stream,
cut into consecutive windows of --ctx bytes, each from a zero state. Runs on CUDA when there
is a GPU, else (slowly) on CPU. Needs only torch and numpy, not ssmport.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rwkv7_trainable import RWKV7, Dims

CHECKPOINT = "rwkv7-pydoc.pth"
LOG = "train_log.jsonl"


def add_training_args(p: argparse.ArgumentParser, steps: int = 1200, batch: int = 128, ctx: int = 512,
                      lr: float = 2e-3, warmup: int = 60) -> None:
    """The options of every trainer here (data, schedule, validation, seed, device)."""
    p.add_argument("--data", type=Path, required=True, help="folder with train.u16 and validation.u16")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--batch", type=int, default=batch, help="windows per step")
    p.add_argument("--ctx", type=int, default=ctx, help="bytes per window")
    p.add_argument("--lr", type=float, default=lr, help="peak learning rate")
    p.add_argument("--final-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=warmup, help="steps of linear warm-up")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=200, help="steps between validation passes (0: at the end only)")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--val-limit", type=int, default=0, help="validate on the first N bytes only (0: all; quick CPU runs)")
    p.add_argument("--time-limit", type=float, default=0, help="seconds; stop early (and say so) past this (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_training_args(p)
    for field, default in Dims().to_json().items():
        p.add_argument(f"--{field.replace('_', '-')}", type=int, default=default, dest=f"dim_{field}")
    return p.parse_args(argv)


def learning_rate(step: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(args.steps - args.warmup, 1)
    return args.final_lr + 0.5 * (args.lr - args.final_lr) * (1 + math.cos(math.pi * progress))


def load_stream(path: Path) -> torch.Tensor:
    return torch.from_numpy(np.fromfile(path, dtype="<u2").astype(np.int64))


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def unigram_loss(train: torch.Tensor, valid: torch.Tensor, vocab: int) -> float:
    """Nats per byte on the held-out stream of the training stream's byte frequencies (add-one
    smoothed): the baseline a trained model must clearly beat."""
    counts = torch.bincount(train, minlength=vocab).double() + 1
    log_p = (counts / counts.sum()).log()
    return float(-log_p[valid[1:]].mean())


@dataclass
class Trainee:
    """What a trainer here trains: `forward` maps ids [B, T] to logits [B, T, V]; `save` writes
    the checkpoint under a folder and returns the file (the validation after it scores the
    model as saved, so `save` may round the weights in place to what it stores)."""

    model: nn.Module
    param_groups: list[dict]
    forward: Callable[[torch.Tensor], torch.Tensor]
    save: Callable[[Path], Path]
    describe: dict  # what the log's start entry says of the model (e.g. {"dims": ...})
    after_step: Callable[[], None] | None = None  # e.g. a mixture of experts' load balancing
    # A training-only loss of the last forward, added to the cross-entropy (e.g. a mixture of
    # experts' load-balancing loss); the log's "loss" stays the cross-entropy, this is "aux_loss".
    aux_loss: Callable[[], torch.Tensor] | None = None


@torch.no_grad()
def validation_loss(trainee: Trainee, stream: torch.Tensor, ctx: int, batch: int, device: str) -> float:
    """Mean nats per byte over consecutive ctx-byte windows of the stream (the tail that
    does not fill a window is left out), each window from a zero state."""
    trainee.model.eval()
    windows = (stream.numel() - 1) // ctx
    inputs = stream[: windows * ctx].view(windows, ctx)
    targets = stream[1 : windows * ctx + 1].view(windows, ctx)
    total = 0.0
    for i in range(0, windows, batch):
        x, y = inputs[i : i + batch].to(device), targets[i : i + batch].to(device)
        total += F.cross_entropy(trainee.forward(x).flatten(0, 1), y.flatten(), reduction="sum").item()
    trainee.model.train()
    return total / (windows * ctx)


def hardware(device: str) -> str:
    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name()} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    return f"CPU {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads (torch {torch.__version__})"


def peak_memory_gb(device: str) -> float | None:
    return round(torch.cuda.max_memory_allocated() / 2**30, 1) if device.startswith("cuda") else None


def train(args, build: Callable[[argparse.Namespace], Trainee], log_name: str = "train_log.jsonl") -> int:
    """Seed, build the trainee, train it on random windows of the training stream (AdamW, warm-up
    then cosine decay, gradients clipped at 1), validate every --eval-every steps, save, and
    validate the saved model on the whole held-out stream; the run goes to --out/`log_name`."""
    torch.manual_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    log = (args.out / log_name).open("w")

    def record(entry: dict) -> None:
        log.write(json.dumps(entry) + "\n")
        log.flush()

    train_ids = load_stream(args.data / "train.u16")
    valid = load_stream(args.data / "validation.u16")
    if args.val_limit:
        valid = valid[: args.val_limit + 1]
    trainee = build(args)
    model = trainee.model.to(args.device)
    optimizer = torch.optim.AdamW(trainee.param_groups, lr=args.lr, betas=(0.9, 0.99), eps=1e-8,
                                  weight_decay=args.weight_decay)  # fmt: skip
    params = sum(p.numel() for p in model.parameters())
    vocab = int(max(train_ids.max(), valid.max())) + 1
    record({
        "event": "start", "command": " ".join(sys.argv), **trainee.describe, "parameters": params,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if not k.startswith("dim_")},
        "hardware": hardware(args.device),
        "data_sha256": {name: file_sha256(args.data / name) for name in ("train.u16", "validation.u16")},
        "tokens": {"train": train_ids.numel(), "validation": valid.numel()},
        "unigram_val_loss": round(unigram_loss(train_ids, valid, vocab), 4),
    })  # fmt: skip
    print(f"{params:,} parameters, {train_ids.numel():,} training bytes, on {hardware(args.device)}", flush=True)

    sampler = torch.Generator().manual_seed(args.seed)
    start = time.perf_counter()
    step, stopped_early = 0, False
    for step in range(args.steps):
        if args.time_limit and time.perf_counter() - start > args.time_limit:
            stopped_early = True
            break
        lr = learning_rate(step, args)
        for group in optimizer.param_groups:
            group["lr"] = lr
        offsets = torch.randint(0, train_ids.numel() - args.ctx - 1, (args.batch,), generator=sampler)
        window = torch.stack([train_ids[o : o + args.ctx + 1] for o in offsets.tolist()]).to(args.device)
        logits = trainee.forward(window[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), window[:, 1:].flatten())
        aux = trainee.aux_loss() if trainee.aux_loss is not None else None
        optimizer.zero_grad(set_to_none=True)
        (loss if aux is None else loss + aux).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if trainee.after_step is not None:
            trainee.after_step()
        if step % args.log_every == 0 or step == args.steps - 1:
            seconds = time.perf_counter() - start
            record({"step": step, "loss": round(loss.item(), 4), "lr": lr, "grad_norm": round(grad_norm.item(), 3),
                    "seconds": round(seconds, 1), **({} if aux is None else {"aux_loss": round(aux.item(), 5)})})  # fmt: skip
            rate = (step + 1) * args.batch * args.ctx / seconds
            print(f"step {step:5d}  loss {loss.item():.4f}  lr {lr:.2e}  {seconds:7.1f} s  {rate:,.0f} bytes/s", flush=True)
        if args.eval_every and step and step % args.eval_every == 0:
            val = validation_loss(trainee, valid, args.ctx, args.batch, args.device)
            record({"step": step, "val_loss": round(val, 4), "seconds": round(time.perf_counter() - start, 1)})
            print(f"step {step:5d}  validation {val:.4f} nats/byte", flush=True)
    steps_done = step if stopped_early else args.steps
    train_seconds = time.perf_counter() - start
    checkpoint = trainee.save(args.out)
    val = validation_loss(trainee, valid, args.ctx, args.batch, args.device)
    record({"event": "end", "steps": steps_done, "stopped_early": stopped_early, "val_loss": round(val, 4),
            "train_seconds": round(train_seconds, 1), "seconds": round(time.perf_counter() - start, 1),
            "checkpoint_sha256": file_sha256(checkpoint), "peak_memory_gb": peak_memory_gb(args.device)})  # fmt: skip
    print(f"done: {steps_done} steps in {train_seconds:.0f} s, validation {val:.4f} nats/byte, "
          f"peak memory {peak_memory_gb(args.device)} GB"
          + (" (stopped early at the time limit)" if stopped_early else ""))  # fmt: skip
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    dims = Dims(**{f: getattr(args, f"dim_{f}") for f in Dims().to_json()})

    def build(args) -> Trainee:
        model = RWKV7(dims)

        def save(out: Path) -> Path:
            weights = {k: v.detach().to("cpu", torch.float16).contiguous() for k, v in model.state_dict().items()}
            torch.save(weights, out / CHECKPOINT)
            return out / CHECKPOINT

        return Trainee(model, model.decay_groups(), model, save, {"dims": dims.to_json()})

    return train(args, build, LOG)


if __name__ == "__main__":
    sys.exit(main())
