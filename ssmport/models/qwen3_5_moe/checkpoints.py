"""Qwen3.5-MoE weights: Qwen3.5's names and packagings (ssmport.models.qwen3_5.checkpoints), the
MLP of every layer replaced by `mlp.gate.weight` [E, C] (router), `mlp.experts.N.{gate,up,down}_proj
.weight` (canonical: one tensor per expert), `mlp.shared_expert.{gate,up,down}_proj.weight` and
`mlp.shared_expert_gate.weight` [1, C]. The experts load from one tensor per expert or from
transformers' fused `mlp.experts.gate_up_proj` / `down_proj`, per layer, strictly."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ssmport.loader.checkpoint import TensorSource
from ssmport.models.loading import AS_IS, check_layer_count, head_name, storage_view
from ssmport.models.moe import MoeNames, fused_expert_storage, moe_shapes
from ssmport.models.qwen3_5.checkpoints import EMBED, HEAD, SKIPPED, VLM_PREFIX, layer
from ssmport.models.qwen3_5.checkpoints import canonical_shapes as dense_shapes
from ssmport.models.qwen3_5_moe.config import Qwen35MoeConfig, from_hf_moe


def moe_names(i: int) -> MoeNames:
    m = layer(i) + "mlp."
    return MoeNames(m + "gate.weight", tuple(f"{m}experts.{{e}}.{w}_proj.weight" for w in ("gate", "up", "down")),
                    shared=tuple(f"{m}shared_expert.{w}_proj.weight" for w in ("gate", "up", "down")),
                    shared_gate=m + "shared_expert_gate.weight")  # fmt: skip


def canonical_shapes(cfg: Qwen35MoeConfig) -> dict[str, tuple[int, ...]]:
    shapes = {n: s for n, s in dense_shapes(cfg).items() if ".mlp." not in n}
    for i in range(cfg.num_layers):
        shapes |= moe_shapes(cfg.moe, moe_names(i), cfg.hidden_size)
    return shapes


def load_hf(cj: Mapping[str, Any], source: TensorSource) -> tuple[Qwen35MoeConfig, TensorSource]:
    """A `Qwen3_5MoeForCausalLM` folder (`model.*`) or the `Qwen3_5MoeForConditionalGeneration`
    packaging (`model.language_model.*`, the vision tower and mtp.* left out by prefix)."""
    cfg = from_hf_moe(cj, source.origin)
    prefix = VLM_PREFIX if any(n.startswith(VLM_PREFIX) for n in source) else "model."
    theirs = lambda name: prefix + name.removeprefix("model.") if name.startswith("model.") else name  # noqa: E731
    check_layer_count(cfg.num_layers, source, prefix + "layers.", source.origin)
    shapes = canonical_shapes(cfg)
    storage = {n: (theirs(n), AS_IS) for n in shapes}
    storage[HEAD] = (head_name(cfg.tie_word_embeddings, source, HEAD, theirs(EMBED)), AS_IS)
    for i in range(cfg.num_layers):
        fused = fused_expert_storage(cfg.moe, moe_names(i), theirs(layer(i) + "mlp.experts."), source)
        storage |= {n: (where, stored) for n, (where, stored) in fused.items()}
    skipped = {n: source.shape(n) for n in source if n.startswith(tuple(SKIPPED))}
    counts = {p: sum(n.startswith(p) for n in skipped) for p in SKIPPED}
    return cfg, storage_view(source, shapes, storage, f"Qwen3.5-MoE {cfg.describe()}", optional=skipped,
                            skipped={p: (SKIPPED[p], k) for p, k in counts.items() if k})  # fmt: skip
