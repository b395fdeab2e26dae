"""Train the small byte-level mixture-of-experts hybrids that ssmport's tests own (tests/data/*_moe_pydoc/).

    python tools/pydoc_corpus.py python3.11-doc_3.11.2-6+deb12u8_all.deb --out data/
    nice -n 5 python tools/train_moe.py --data data/ --out run/     # lfm2_moe: the committed run's settings
    nice -n 5 python tools/train_moe.py --family qwen3_5_moe --data data/ --out run/

Each family is transformers' own class (the one ssmport's family is tested against) with a
tiny byte-level config kept here as data (FAMILIES; `--set KEY=JSON` overrides a key), on the
same corpus, split and byte ids as rwkv7-pydoc (tools/pydoc_corpus.py: id 0 end of text, byte b
is id b + 1), trained by tools/train_tiny.py's loop (random windows, AdamW, warm-up then cosine
decay, validation on the held-out stream).

Routing is balanced as the family balances it:
- a bias that ranks experts without weighting them (LFM2-MoE's `expert_bias`, Nemotron-H's
  `e_score_correction_bias`), no auxiliary loss: after each step every MoE layer's bias moves
  by --balance-rate toward the experts it chose less than the mean (sign(mean load - load));
- else transformers' own load-balancing loss (Switch Transformer's, `load_balancing_loss_func`,
  what `output_router_logits=True` returns) times the config's `router_aux_loss_coef`, added
  to the cross-entropy (Qwen3.5-MoE, Granite-4.0-H MoE).

The Mamba-2 families' scan chunk is 64 (transformers' torch path scores each chunk's
[chunk, chunk] decay matrix; 64 is 2.5x faster here than 128-256 and the same math).

Writes to --out: the model as `save_pretrained` writes it (config.json, generation_config.json,
model.safetensors) in fp16, the byte vocab `vocab.tsv` ssmport's tokenizer lookup finds next to
it (rwkv7-pydoc's), and `train_log.jsonl` (settings, hardware, the unigram baseline, the loss
curve, validation losses of the weights as saved, expert shares at the end). CPU is enough:
the committed runs are one thread.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from train_tiny import Trainee, add_training_args, train

LOG = "train_log.jsonl"
VOCAB = Path(__file__).resolve().parents[1] / "ssmport" / "loader" / "pretrained" / "rwkv7_pydoc" / "vocab.tsv"
END_OF_TEXT = 0  # tools/pydoc_corpus.py
NEMOTRON_PATTERN = "MEMEM*EMEM*E"
BYTE_IDS = {"vocab_size": 288, "bos_token_id": END_OF_TEXT, "eos_token_id": END_OF_TEXT, "pad_token_id": None}  # 257 used


@dataclass(frozen=True)
class Family:
    """One family's transformers classes, tiny config and routing."""

    model_class: str
    config_class: str
    config: dict
    router_class: str  # returns (logits, top-k weights, top-k experts)
    aux_loss: bool = False  # balanced by transformers' load-balancing loss, else by its expert bias
    edit_saved_config: dict = field(default_factory=dict)  # keys rewritten in config.json as released files spell them


FAMILIES = {
    # 6 layers (conv, conv, attention, conv, conv, attention), H 128; layers 2-5 MoE.
    "lfm2_moe": Family("Lfm2MoeForCausalLM", "Lfm2MoeConfig", {
        **BYTE_IDS, "hidden_size": 128, "intermediate_size": 320, "moe_intermediate_size": 96,
        "num_hidden_layers": 6, "layer_types": ["conv", "conv", "full_attention", "conv", "conv", "full_attention"],
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_dense_layers": 2, "num_experts": 8,
        "num_experts_per_tok": 2, "use_expert_bias": True, "norm_topk_prob": True, "routed_scaling_factor": 1.0,
        "max_position_embeddings": 2048, "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, "Lfm2MoeTopKRouter"),
    # 6 layers (Gated DeltaNet x2, gated attention, x2, attention), H 128, every layer MoE with a
    # shared expert; rotary on half of each 32-wide head (text-only M-RoPE = 1-D RoPE).
    "qwen3_5_moe": Family("Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig", {
        **BYTE_IDS, "hidden_size": 128, "num_hidden_layers": 6,
        "layer_types": ["linear_attention", "linear_attention", "full_attention",
                        "linear_attention", "linear_attention", "full_attention"],
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
        "linear_conv_kernel_dim": 4, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 128, "router_aux_loss_coef": 0.01, "max_position_embeddings": 2048,
        "tie_word_embeddings": True, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
        "partial_rotary_factor": 0.5, "mrope_section": [4, 2, 2], "mrope_interleaved": True}},
        "Qwen3_5MoeTopKRouter", aux_loss=True),
    # 12 one-mixer blocks as Nemotron-3 Nano begins (Mamba-2 M, attention *, MoE E), H 128: 5
    # MoE layers of 8 relu^2 experts top-2 (sigmoid scores, correction bias, one group, top-k
    # weights normalised, scaling 2.5 as released) and a shared expert.
    "nemotron_h": Family("NemotronHForCausalLM", "NemotronHConfig", {
        **BYTE_IDS, "hidden_size": 128, "hybrid_override_pattern": NEMOTRON_PATTERN, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 256, "mamba_num_heads": 8,
        "mamba_head_dim": 32, "n_groups": 2, "ssm_state_size": 16, "conv_kernel": 4, "use_conv_bias": True,
        "tie_word_embeddings": False, "max_position_embeddings": 2048, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "moe_intermediate_size": 96, "moe_shared_expert_intermediate_size": 128,
        "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
        "chunk_size": 64},
        "NemotronHTopkRouter", edit_saved_config={"layers_block_type": None, "hybrid_override_pattern": NEMOTRON_PATTERN,
                                                  "num_hidden_layers": len(NEMOTRON_PATTERN)}),
    # 6 layers (Mamba-2 x2, attention, x2, attention; no positional encoding as released), H 128,
    # every layer 8 routed SwiGLU experts top-2 (softmax over the top-k logits) and a shared MLP;
    # Granite's multipliers (attention 1/head_dim); tied embedding.
    "granitemoehybrid": Family("GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig", {
        **BYTE_IDS, "hidden_size": 128, "intermediate_size": 64, "shared_intermediate_size": 128,
        "num_hidden_layers": 6, "layer_types": ["mamba", "mamba", "attention", "mamba", "mamba", "attention"],
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 8, "num_experts_per_tok": 2,
        "mamba_n_heads": 8, "mamba_d_head": 32, "mamba_n_groups": 1, "mamba_d_state": 16, "mamba_d_conv": 4,
        "mamba_expand": 2, "position_embedding_type": "nope", "tie_word_embeddings": True,
        "max_position_embeddings": 2048, "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
        "attention_multiplier": 1 / 32, "logits_scaling": 4.0, "router_aux_loss_coef": 0.01,
        "mamba_chunk_size": 64},
        "GraniteMoeHybridTopKRouter", aux_loss=True),
}  # fmt: skip


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_training_args(p, steps=850, batch=16, ctx=256, lr=3e-3, warmup=30)
    p.add_argument("--family", choices=sorted(FAMILIES), default="lfm2_moe")
    p.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="override a key of the family's config")
    p.add_argument("--balance-rate", type=float, default=1e-3, help="expert bias step per training step")
    return p.parse_args(argv)


def config_of(args):
    import transformers

    family = FAMILIES[args.family]
    values = dict(family.config)
    for item in args.set:
        key, _, value = item.partition("=")
        values[key] = json.loads(value)
    return getattr(transformers, family.config_class)(**values)


class LoadBalancer:
    """Counts each MoE layer's expert choices during training steps and, after each, moves the
    layer's expert bias (where it has one) by `rate` toward the experts used less than the mean."""

    def __init__(self, model, router_class: str, rate: float):
        self.rate, self.biases, self.loads = rate, [], []
        for name, module in model.named_modules():
            if type(module).__name__ == router_class:
                parent = model.get_submodule(name.rsplit(".", 1)[0])
                bias = getattr(module, "e_score_correction_bias", None)
                self.biases.append(parent.expert_bias if getattr(parent, "use_expert_bias", False) else bias)
                self.loads.append(torch.zeros(module.num_experts))
                module.register_forward_hook(self._counter(len(self.loads) - 1))
        self.totals = [torch.zeros_like(load) for load in self.loads]

    def _counter(self, i: int):
        def count(module, args, out):
            if module.training:
                self.loads[i] += torch.bincount(out[2].flatten().cpu(), minlength=self.loads[i].numel()).float()

        return count

    @torch.no_grad()
    def step(self) -> None:
        for bias, load, total in zip(self.biases, self.loads, self.totals):
            if bias is not None:
                bias += self.rate * torch.sign(load.mean() - load).to(bias.device)
            total += load
            load.zero_()

    def shares(self) -> list[list[float]]:
        """Each MoE layer's share of the choices per expert, over the whole run."""
        return [[round(float(x), 3) for x in t / t.sum()] for t in self.totals]


def main(argv=None) -> int:
    args = parse_args(argv)
    import transformers

    family = FAMILIES[args.family]
    config = config_of(args)
    balancer = None

    def build(args) -> Trainee:
        nonlocal balancer
        model = getattr(transformers, family.model_class)(config)
        balancer = LoadBalancer(model, family.router_class, args.balance_rate)
        decayed = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
        plain = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
        aux = {}

        def forward(ids):
            out = model(input_ids=ids, use_cache=False, output_router_logits=family.aux_loss and model.training)
            aux["loss"] = out.aux_loss
            return out.logits

        def save(out: Path) -> Path:
            model.half()  # fp16 storage; the validation after this scores the weights as stored
            model.save_pretrained(out)
            model.float()
            if family.edit_saved_config:
                path = out / "config.json"
                saved = json.loads(path.read_text())
                for key, value in family.edit_saved_config.items():
                    saved.pop(key, None) if value is None else saved.__setitem__(key, value)
                path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
            shutil.copyfile(VOCAB, out / VOCAB.name)
            return out / "model.safetensors"

        aux_loss = (lambda: config.router_aux_loss_coef * aux["loss"]) if family.aux_loss else None
        return Trainee(model, [{"params": decayed}, {"params": plain, "weight_decay": 0.0}], forward, save,
                       {"family": args.family, "config": config.to_dict()}, balancer.step, aux_loss)  # fmt: skip

    done = train(args, build, LOG)
    with (args.out / LOG).open("a") as log:
        log.write(json.dumps({"event": "expert_shares", "layers": balancer.shares()}) + "\n")
    return done


if __name__ == "__main__":
    sys.exit(main())
