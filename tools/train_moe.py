"""Train the small byte-level LFM2-MoE that ssmport's tests own (tests/data/lfm2_moe_pydoc/).

    python tools/pydoc_corpus.py python3.11-doc_3.11.2-6+deb12u8_all.deb --out data/
    nice -n 5 python tools/train_moe.py --data data/ --out run/     # the committed run's settings

transformers' own `Lfm2MoeForCausalLM` (the class ssmport's lfm2_moe family is tested
against), on the same corpus, split and byte ids as rwkv7-pydoc (tools/pydoc_corpus.py: id 0
end of text, byte b is id b + 1), trained by tools/train_tiny.py's loop (random windows, AdamW,
warm-up then cosine decay, validation on the held-out stream). Routing is balanced as
LFM2-MoE's expert bias is meant to be, without an auxiliary loss: after each step every MoE
layer's bias moves by --balance-rate toward the experts it used less than the mean
(sign(mean load - load)); the bias ranks experts, it does not weight them.

Writes to --out: the model as `save_pretrained` writes it (config.json, generation_config.json,
model.safetensors) in fp16, the byte vocab `vocab.tsv` ssmport's tokenizer lookup finds next to
it (rwkv7-pydoc's), and `train_log.jsonl` (settings, hardware, the unigram baseline, the loss
curve, validation losses of the weights as saved, expert loads at the end). CPU is enough:
the committed run is one thread.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

from train_tiny import Trainee, add_training_args, train

LOG = "train_log.jsonl"
VOCAB = Path(__file__).resolve().parents[1] / "ssmport" / "loader" / "pretrained" / "rwkv7_pydoc" / "vocab.tsv"
END_OF_TEXT = 0  # tools/pydoc_corpus.py


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_training_args(p, steps=850, batch=16, ctx=256, lr=3e-3, warmup=30)
    p.add_argument("--vocab", type=int, default=288, help="embedding rows (257 used: end of text + 256 bytes)")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", default="conv,conv,full_attention,conv,conv,full_attention",
                   help="layer types, comma-separated")  # fmt: skip
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--ffn", type=int, default=320, help="the dense layers' SwiGLU width")
    p.add_argument("--dense-layers", type=int, default=2)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--moe-ffn", type=int, default=96, help="each expert's SwiGLU width")
    p.add_argument("--balance-rate", type=float, default=1e-3, help="expert bias step per training step")
    return p.parse_args(argv)


def config_of(args):
    from transformers import Lfm2MoeConfig

    layers = args.layers.split(",")
    return Lfm2MoeConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.ffn, moe_intermediate_size=args.moe_ffn,
        num_hidden_layers=len(layers), layer_types=layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, num_dense_layers=args.dense_layers, num_experts=args.experts,
        num_experts_per_tok=args.top_k, use_expert_bias=True, norm_topk_prob=True, routed_scaling_factor=1.0,
        max_position_embeddings=2048, tie_word_embeddings=True, pad_token_id=None, bos_token_id=END_OF_TEXT,
        eos_token_id=END_OF_TEXT, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    )  # fmt: skip


class LoadBalancer:
    """Counts each MoE layer's expert choices during training steps and, after each, moves its
    expert bias by `rate` toward the experts used less than the mean."""

    def __init__(self, model, rate: float):
        self.rate, self.blocks, self.loads = rate, [], []
        for module in model.modules():
            if hasattr(module, "expert_bias") and hasattr(module, "gate"):
                self.blocks.append(module)
                self.loads.append(torch.zeros(module.expert_bias.numel()))
                module.gate.register_forward_hook(self._counter(len(self.blocks) - 1))
        self.totals = [torch.zeros_like(load) for load in self.loads]

    def _counter(self, i: int):
        def count(module, args, out):
            if module.training:
                self.loads[i] += torch.bincount(out[2].flatten().cpu(), minlength=self.loads[i].numel()).float()

        return count

    @torch.no_grad()
    def step(self) -> None:
        for block, load, total in zip(self.blocks, self.loads, self.totals):
            block.expert_bias += self.rate * torch.sign(load.mean() - load).to(block.expert_bias.device)
            total += load
            load.zero_()

    def shares(self) -> list[list[float]]:
        """Each MoE layer's share of the choices per expert, over the whole run."""
        return [[round(float(x), 3) for x in t / t.sum()] for t in self.totals]


def main(argv=None) -> int:
    args = parse_args(argv)
    from transformers import Lfm2MoeForCausalLM

    config = config_of(args)
    balancer = None

    def build(args) -> Trainee:
        nonlocal balancer
        model = Lfm2MoeForCausalLM(config)
        balancer = LoadBalancer(model, args.balance_rate)
        decayed = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed_tokens" not in n]
        plain = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed_tokens" not in n)]

        def save(out: Path) -> Path:
            model.half()  # fp16 storage; the validation after this scores the weights as stored
            model.save_pretrained(out)
            model.float()
            shutil.copyfile(VOCAB, out / VOCAB.name)
            return out / "model.safetensors"

        return Trainee(model, [{"params": decayed}, {"params": plain, "weight_decay": 0.0}],
                       lambda ids: model(input_ids=ids, use_cache=False).logits, save,
                       {"config": config.to_dict()}, balancer.step)  # fmt: skip

    done = train(args, build, LOG)
    with (args.out / LOG).open("a") as log:
        log.write(json.dumps({"event": "expert_shares", "layers": balancer.shares()}) + "\n")
    return done


if __name__ == "__main__":
    sys.exit(main())
