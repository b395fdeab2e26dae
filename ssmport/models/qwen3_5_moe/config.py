"""Qwen3.5-MoE (`qwen3_5_moe`, `qwen3_5_moe_text`) config: Qwen3.5's layers (read by
ssmport.models.qwen3_5.config) with routed experts and a gated shared expert in every MLP
(transformers' Qwen3_5MoeTextConfig keys), and the presets of the released sizes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ssmport.architectures.base import HubSource, Preset
from ssmport.errors import CheckpointError
from ssmport.models.loading import ConfigReader
from ssmport.models.moe import SOFTMAX, MoeSpec
from ssmport.models.qwen3_5.config import _COMMON, FULL, LINEAR, Qwen35Config, _pattern, from_hf

# Qwen3_5MoeTextConfig's defaults in transformers 5.24 for the keys it adds (Qwen3.5-35B-A3B's values).
MOE_DEFAULTS = {"num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
                "shared_expert_intermediate_size": 512, "intermediate_size": 1}  # no dense MLP: F unused


@dataclass(frozen=True)
class Qwen35MoeConfig(Qwen35Config):
    num_experts: int = 256
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 512
    shared_expert_intermediate_size: int = 512

    @property
    def moe(self) -> MoeSpec:
        """Softmax over all experts, top-k renormalised to sum 1 (always, whatever norm_topk_prob
        says: transformers' Qwen3_5MoeTopKRouter does), a shared expert times sigmoid(gate)."""
        return MoeSpec(self.num_experts, self.num_experts_per_tok, self.moe_intermediate_size, SOFTMAX, True,
                       shared_width=self.shared_expert_intermediate_size, shared_gate=True)  # fmt: skip

    def validate(self, origin: str) -> None:
        super().validate(origin)
        if not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise CheckpointError(f"{origin}: Qwen3.5-MoE num_experts_per_tok {self.num_experts_per_tok} is not in "
                                  f"[1, num_experts={self.num_experts}]")  # fmt: skip

    def describe(self) -> str:
        return super().describe()[:-1] + f", {self.moe.describe()})"


def from_hf_moe(cj: Mapping[str, Any], origin: str) -> Qwen35MoeConfig:
    """A `qwen3_5_moe_text` config, or the `text_config` of a `qwen3_5_moe` (VLM-packaged) one."""
    base = from_hf(cj, origin, experts=True)
    text = cj["text_config"] if isinstance(cj.get("text_config"), Mapping) else cj
    r = ConfigReader(text, origin, "Qwen3.5-MoE", MOE_DEFAULTS)
    cfg = Qwen35MoeConfig(**(asdict(base) | {"intermediate_size": 1}), num_experts=r.int("num_experts", hi=4096),
                          num_experts_per_tok=r.int("num_experts_per_tok", hi=4096),
                          moe_intermediate_size=r.int("moe_intermediate_size"),
                          shared_expert_intermediate_size=r.int("shared_expert_intermediate_size"))  # fmt: skip
    cfg.validate(origin)
    return cfg


# Qwen3.5-35B-A3B: 40 layers (30 Gated DeltaNet + 10 gated attention), C2048, 256 experts of 512,
# top 8, a shared expert of 512 (transformers' Qwen3_5MoeTextConfig defaults). Qwen3.6-35B-A3B is
# taken to share its shape: not confirmed here (no Hub access).
_A3B = _COMMON | {"hidden_size": 2048, "intermediate_size": 1, "layer_types": _pattern(40), "num_attention_heads": 16,
                  "num_key_value_heads": 2, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
                  "tie_word_embeddings": False}  # fmt: skip

PRESETS = (
    Preset("qwen3.5-35b-a3b", "qwen3_5_moe", _A3B,
           "Qwen3.5-35B-A3B (L40: 30 Gated DeltaNet + 10 gated attention, C2048, 8 of 256 experts x 512 + shared 512)",
           True, HubSource("Qwen/Qwen3.5-35B-A3B", confirmed="transformers' Qwen3_5MoeTextConfig defaults + model card")),
    Preset("qwen3.6-35b-a3b", "qwen3_5_moe", _A3B,
           "Qwen3.6-35B-A3B (Qwen3.5-35B-A3B's shape: unconfirmed)", True, HubSource("Qwen/Qwen3.6-35B-A3B")),
    Preset("qwen3.5-moe-tiny", "qwen3_5_moe",
           {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 1,
            "layer_types": [LINEAR, LINEAR, FULL, LINEAR, FULL], "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
            "linear_value_head_dim": 12, "linear_conv_kernel_dim": 4, "rotary_dim": 8, "rope_theta": 10000.0,
            "max_position_embeddings": 256, "context": 64, "num_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48},
           "test model: qwen3.5-tiny's layers, 2 of 8 experts x 32 + a gated shared expert of 48", False),
)  # fmt: skip
