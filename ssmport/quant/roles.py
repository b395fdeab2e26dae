"""The roles a weight can play, as the per-tensor plan and the quantization predicates name them.

Each architecture maps its canonical weight names to a role (its `quant.py`) and says which
roles stay float under int8keepproj; the recipe applies that. Plugins may use their own role
strings; these are the ones the built-ins use.
"""

from enum import StrEnum


class Role(StrEnum):
    EMBEDDING = "embedding"
    HEAD = "head"  # the LM head: reads nothing back into a state
    FFN = "ffn"  # MLP / channel-mix matmuls (routed and shared experts too): the weight bulk
    ROUTER = "router"  # a mixture-of-experts router and shared-expert gate: decide, stay float
    STATE_PROJ = "state_proj"  # projections whose outputs enter the recurrence (r/k/v, in_proj, q/k/v/a/b/g)
    OUT_PROJ = "out_proj"  # writes the residual stream every later layer's recurrence reads
    ATTN_PROJ = "attn_proj"  # q/k/v/o of a softmax-attention layer (hybrids)
    LORA = "lora"  # RWKV-7's low-rank decay / a / v / gate factors
    MIX = "mix"  # token-shift mixes and per-channel vectors of the recurrence
    CONV = "conv"  # short causal convolutions
    DECAY = "decay"  # A_log, dt_bias
    SSM = "ssm"  # Mamba-2's conv, A_log, dt_bias and D
    NORM = "norm"
