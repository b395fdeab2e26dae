"""Qwen3.5's multi-token-prediction head (`mtp.*`) as the bundle's draft function.

The head predicts the token after next from the target's hidden state and the next token
(as vLLM's and SGLang's Qwen3.5 / Qwen3-Next MTP modules read the released weights):

    e = rmsnorm1p(embed[x_{t+1}], pre_fc_norm_embedding)
    h = rmsnorm1p(hidden_t, pre_fc_norm_hidden)   hidden_t: the target's final-norm output at t
    y = fc([e | h])                               fc [C, 2C]: the embedding's columns first
    y = decoder_layer(y)                          a full-attention layer with its own KV cache
    logits_{t+2} = lm_head(rmsnorm1p(y, mtp.norm)), and rmsnorm1p(y, mtp.norm) is the hidden
                                                  the next draft step reads as its hidden_t

hidden_t is the output of the target's final norm (`model.norm`): that is what those engines'
model forward returns and hand to the head (the lm_head reads it too), and the head's own
output, after `mtp.norm`, is likewise normed before it is fed back. The layer's rows sit at
the hidden's position t (vLLM's convention); RoPE only sees position differences, so t + 1
would give the same numbers.

    draft(input_ids int32 [1,R], position_ids int32 [1,R], hidden [1,R,C], valid_len int32 [1])
        -> logits [1,R,V], hidden [1,R,C]         states: mtpKeyCache, mtpValueCache

Row r is (x_{t+1}, hidden_t) at position t; rows >= valid_len are padding. One call catches
the head up on the tokens the target has accepted, from the target's true hiddens (its main,
prefill and verify functions output them as "hidden" in such a bundle), and the last row's
logits are the first draft; each further draft is one more call of one row, fed the head's
own hidden. Rows written from the head's own hidden are rewritten from the target's on the
next catch-up before any row reads them (attention masks positions past a row's own), so the
cache needs no rollback. The cache is static (`--context` positions): the head is one layer.
"""

from __future__ import annotations

import torch
from torch import nn

from ssmport.graph import CausalLM, Step
from ssmport.loader.checkpoint import TensorSource
from ssmport.models.layers.attention import norm_gain
from ssmport.models.qwen3_5.block import Qwen35Block, dense_mlp
from ssmport.models.qwen3_5.mtp_checkpoint import MTP_FC, MTP_LAYER, MTP_NORM, MTP_NORM_EMBEDDING, MTP_NORM_HIDDEN
from ssmport.models.qwen3_5.config import ZERO_CENTRED, Qwen35Config
from ssmport.ops.norms import rms_norm
from ssmport.quant.plan import WeightBuilder
from ssmport.quant.roles import Role
from ssmport.state import KV, StateSpec

MTP_KEY_CACHE, MTP_VALUE_CACHE = "mtpKeyCache", "mtpValueCache"


def mtp_state_specs(cfg: Qwen35Config, dtype: torch.dtype) -> list[StateSpec]:
    a = cfg.attention
    shape = (1, 1, a.kv_heads, cfg.context, a.head_dim)
    axes = "[mtp layer, batch, kv head, position, head_dim]"
    return [StateSpec(MTP_KEY_CACHE, shape, dtype, axes + " (K after k-norm and RoPE)", KV),
            StateSpec(MTP_VALUE_CACHE, shape, dtype, axes, KV)]  # fmt: skip


class MTPDraft(CausalLM):
    """The draft function over the target's embedding and LM head (shared weights) and the
    head's own fc, norms and decoder layer; its states are the layer's KV cache (buffers)."""

    def __init__(self, cfg: Qwen35Config, src: TensorSource, b: WeightBuilder, decode: nn.Module, rows: int,
                 state_dtype: torch.dtype):  # fmt: skip
        block = Qwen35Block(cfg, 0, src, b, dense_mlp, prefix=MTP_LAYER)
        block.mixer.states = block.states = (MTP_KEY_CACHE, MTP_VALUE_CACHE)
        super().__init__(decode.embed, [block], decode.head, mtp_state_specs(cfg, state_dtype), chunk=rows,
                         all_logits=True)  # fmt: skip
        gain = lambda n: b.vector(n, norm_gain(src[n], ZERO_CENTRED), Role.NORM)  # noqa: E731
        self.norm_embedding, self.norm_hidden, self.norm = gain(MTP_NORM_EMBEDDING), gain(MTP_NORM_HIDDEN), gain(MTP_NORM)
        self.fc = b.matmul(MTP_FC, src[MTP_FC].t(), Role.ATTN_PROJ)
        self.eps = cfg.rms_norm_eps

    def forward(self, input_ids, position_ids, hidden, valid_len):
        T = self.chunk
        step = Step(valid_len, position_ids.view(T))
        e = rms_norm(self.embed(input_ids.view(T)), self.norm_embedding, self.eps)
        h = rms_norm(hidden.view(T, -1).float(), self.norm_hidden, self.eps)
        y = self.run_blocks(self.fc(torch.cat([e, h], dim=-1)), step)
        out = rms_norm(y, self.norm, self.eps)
        return self.head.proj(out).view(1, T, -1), out.view(1, T, -1)

    def example(self) -> tuple:
        T, C = self.chunk, self.norm.shape[0]
        ids = (torch.zeros(1, T, dtype=torch.int32), torch.zeros(1, T, dtype=torch.int32))
        return ids + (torch.zeros(1, T, C), torch.ones(1, dtype=torch.int32))


def build_draft(cfg: Qwen35Config, src: TensorSource, b: WeightBuilder, decode: nn.Module, rows: int,
                state_dtype: torch.dtype) -> MTPDraft | None:  # fmt: skip
    """The draft function of a checkpoint with its MTP head loaded (None without one)."""
    if not getattr(cfg, "mtp_layers", 0):
        return None
    return MTPDraft(cfg, src, b, decode, rows, state_dtype).eval()


__all__ = ["MTP_KEY_CACHE", "MTP_VALUE_CACHE", "MTPDraft", "build_draft", "mtp_state_specs"]
