"""Which RWKV-6 weights stay float under int8keepproj."""

from __future__ import annotations

from ssmport.models.rwkv7 import quant as rwkv7_quant
from ssmport.quant.roles import Role

_LORAS = ("time_maa_w1", "time_maa_w2", "time_decay_w1", "time_decay_w2")


def role(name: str) -> Role:
    """Plan category of a canonical weight name: RWKV-7's roles for the names the two share
    (embedding, head, norms, r/k/v/o, the FFN's key/value), plus x060's own."""
    _, _, block, leaf, *_ = name.split(".") + ["", "", ""]
    if block == "ffn" and leaf == "receptance":  # the channel mix's sigmoid gate: reads no state
        return Role.FFN
    if block == "att" and leaf == "gate":
        return Role.STATE_PROJ
    if block == "att" and leaf in _LORAS:
        return Role.LORA
    return rwkv7_quant.role(name)  # time_maa_*, time_decay, time_faaaa: MIX


# As RWKV-7's (models/rwkv7/quant.py): what feeds the recurrence stays float. The decay LoRA
# sits inside exp(-exp(.)): an int8 error e there multiplies the log decay by exp(e),
# compounding over every later token; the time_maa LoRAs choose how much of the previous token
# r/k/v/w read; time_faaaa and ln_x scale the output directly. (The rwkv package keeps
# time_decay, time_faaaa and ln_x in fp32 and never quantises the LoRAs either.)
KEEP_FLOAT_ROLES = rwkv7_quant.KEEP_FLOAT_ROLES
