"""OLMo-Hybrid weights. Canonical names are `OlmoHybridForCausalLM`'s own (`model.*`,
`lm_head.weight`), nn.Linear [out, in], the fused depthwise conv [q | k | v, 1, K].

Folders spell some of them the OLMo-core way, which transformers renames on load
(`conversion_mapping`, "olmo_hybrid") and which its `save_pretrained` writes back:
`attention_layer_norm` for `input_layernorm`, `feedforward_layer_norm` for
`post_attention_layernorm` (in a linear-attention layer the MLP's pre-norm; in an attention
layer the attention output's post-norm), and three convs `{q,k,v}_conv1d` concatenated into
`conv1d` (any split of the q | k | v rows: transformers 5.24 writes three equal parts)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ssmport.loader.checkpoint import TensorSource
from ssmport.errors import CheckpointError
from ssmport.models.layers.attention import AttentionNames, attention_names, attention_shapes
from ssmport.models.loading import check_layer_count, checked_view, head_name
from ssmport.models.olmo_hybrid.config import FULL, OlmoHybridConfig, from_hf

EMBED, HEAD, NORM = "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"
# canonical -> OLMo-core spelling (transformers' WeightRenaming pairs)
OLMO_CORE_NAMES = {"input_layernorm": "attention_layer_norm", "post_attention_layernorm": "feedforward_layer_norm"}
SPLIT_CONVS = ("q_conv1d", "k_conv1d", "v_conv1d")


def layer(i: int) -> str:
    return f"model.layers.{i}."


def attention(cfg: OlmoHybridConfig, i: int) -> AttentionNames:
    return attention_names(layer(i) + "self_attn.", norm="norm", bias=cfg.attention_bias)


def canonical_shapes(cfg: OlmoHybridConfig) -> dict[str, tuple[int, ...]]:
    C, F, V, d = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.delta_rule
    shapes: dict[str, tuple[int, ...]] = {EMBED: (V, C)}
    for i, kind in enumerate(cfg.layer_types):
        p = layer(i)
        norms = ("post_attention_layernorm", "post_feedforward_layernorm") if kind == FULL else ("input_layernorm",
                                                                                                "post_attention_layernorm")  # fmt: skip
        shapes |= {p + n + ".weight": (C,) for n in norms}
        shapes |= {p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C), p + "mlp.down_proj.weight": (C, F)}
        if kind == FULL:
            shapes |= attention_shapes(cfg.attention, attention(cfg, i), C)
        else:
            a, HV = p + "linear_attn.", d.v_heads
            shapes |= {a + "q_proj.weight": (d.key_dim, C), a + "k_proj.weight": (d.key_dim, C),
                       a + "v_proj.weight": (d.value_dim, C), a + "a_proj.weight": (HV, C), a + "b_proj.weight": (HV, C),
                       a + "g_proj.weight": (d.value_dim, C), a + "conv1d.weight": (d.conv_dim, 1, d.conv_kernel),
                       a + "A_log": (HV,), a + "dt_bias": (HV,), a + "o_norm.weight": (d.v_dim,),
                       a + "o_proj.weight": (C, d.value_dim)}  # fmt: skip
    return shapes | {NORM: (C,), HEAD: (V, C)}


def load_hf(cj: Mapping[str, Any], source: TensorSource) -> tuple[OlmoHybridConfig, TensorSource]:
    """An `OlmoHybridForCausalLM` folder, in transformers' names or OLMo-core's (or a mix, per tensor)."""
    cfg = from_hf(cj, source.origin)
    check_layer_count(cfg.num_layers, source, "model.layers.", source.origin)
    source = _FusedConvs(source)
    shapes = canonical_shapes(cfg)
    core = any(f".{n}." in name for name in source for n in OLMO_CORE_NAMES.values())  # errors name what is missing in its spelling
    renamed = {n: _spelling(n, source, core) for n in shapes} | {HEAD: head_name(cfg.tie_word_embeddings, source, HEAD, EMBED)}
    return cfg, checked_view(source, shapes, renamed, None, f"OLMo-Hybrid {cfg.describe()}")


def _spelling(name: str, source: TensorSource, core: bool) -> str:
    """The canonical name if the folder has it, else its OLMo-core spelling if the folder uses those."""
    prefix, _, rest = name.rpartition(".weight")[0].rpartition(".")
    return f"{prefix}.{OLMO_CORE_NAMES[rest]}.weight" if core and rest in OLMO_CORE_NAMES and name not in source else name


class _FusedConvs(TensorSource):
    """`source` with every linear-attention layer's `{q,k,v}_conv1d.weight` read as one
    `conv1d.weight`, concatenated in that order (transformers' `Concatenate(dim=0)`)."""

    def __init__(self, source: TensorSource):
        self.origin, self._source = source.origin, source
        self._parts: dict[str, list[str]] = {}
        for n in source:
            for part in SPLIT_CONVS:
                if n.endswith(f".{part}.weight"):
                    self._parts.setdefault(n.removesuffix(f"{part}.weight") + "conv1d.weight", []).append(n)
        for fused, parts in self._parts.items():
            want = [fused.replace("conv1d", p) for p in SPLIT_CONVS]
            trailing = {source.shape(p)[1:] for p in parts}
            if sorted(parts) != sorted(want) or len(trailing) != 1 or len(source.shape(parts[0])) != 3 or fused in source:
                raise CheckpointError(f"{self.origin}: the split convs of {fused.removesuffix('.conv1d.weight')} must be "
                                      f"{', '.join(SPLIT_CONVS)} of one [rows, 1, K] shape each, and no conv1d; found "
                                      + ", ".join(f"{p} {list(source.shape(p))}" for p in sorted(parts + [fused] * (fused in source))))  # fmt: skip
            self._parts[fused] = want
        self._hidden = {p for parts in self._parts.values() for p in parts}

    def __getitem__(self, name: str) -> torch.Tensor:
        parts = self._parts.get(name)
        return torch.cat([self._source[p] for p in parts]) if parts else self._source[name]

    def __iter__(self) -> Iterator[str]:
        return iter([n for n in self._source if n not in self._hidden] + list(self._parts))

    def __len__(self) -> int:
        return len(self._source) - len(self._hidden) + len(self._parts)

    def shape(self, name: str) -> tuple[int, ...]:
        parts = self._parts.get(name)
        if not parts:
            return self._source.shape(name)
        first = self._source.shape(parts[0])
        return (sum(self._source.shape(p)[0] for p in parts), *first[1:])

    def dtype(self, name: str) -> torch.dtype:
        return self._source.dtype(self._parts.get(name, [name])[0])

    def release_pages(self) -> None:
        self._source.release_pages()

    def storage_keys(self) -> frozenset[int]:
        return self._source.storage_keys()
