"""A trainable RWKV-7 (x070) in plain torch whose `state_dict()` is a BlinkDL `.pth`.

Written for reading, independent of ssmport (it runs where ssmport is not installed, e.g. a
GPU box with another torch). The math is the inference math of BlinkDL's `RWKV_x070` and
ssmport's `RWKV7Reference`, over a whole [B, T] batch at once: every projection runs on all
T rows; only the WKV recurrence loops over T (`wkv7`). Module and parameter names are
BlinkDL's, with BlinkDL's shapes ([1, 1, C] per-channel vectors, nn.Linear [out, in]), so
`model.state_dict()` loads strictly with ssmport's BlinkDL loader and with the `rwkv` package.

Initial values follow the ideas of RWKV-LM's x070 trainer (per-layer token-shift ramps, a
spread of decays across channels, zero output projections), simplified.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

DECAY_SCALE = math.exp(-0.5)  # decay = exp(-DECAY_SCALE * sigmoid(.)), in (0.545, 1)
LN_X_EPS = 64e-5  # BlinkDL's GroupNorm eps after the WKV (1e-5 * head_size_divisor 8 ** 2)
MIXES = ("r", "w", "k", "v", "a", "g")


@dataclass(frozen=True)
class Dims:
    vocab: int = 320  # 256 bytes + end of text, padded to a multiple of 64
    width: int = 256
    layers: int = 4
    head: int = 64
    ffn: int = 1024
    decay_lora: int = 32
    a_lora: int = 32
    v_lora: int = 32
    gate_lora: int = 64

    @property
    def heads(self) -> int:
        return self.width // self.head

    def to_json(self) -> dict:
        return asdict(self)


def token_shift(x: torch.Tensor) -> torch.Tensor:
    """Each position's predecessor along T (zeros before the first): x [B, T, C]."""
    return F.pad(x, (0, 0, 1, -1))


def wkv7(r, decay, k, v, a, b, heads: int) -> torch.Tensor:
    """The WKV-7 recurrence from a zero state, per head, in BlinkDL's layout S [value, key]:

        S_t = S_{t-1} diag(decay_t) + (S_{t-1} a_t) b_t^T + v_t k_t^T        y_t = S_t r_t

    with a = -kk and b = kk * a_lr (the removal key and in-context learning rate). All inputs
    [B, T, C] fp32; returns y [B, T, C]. Tensors are unbound along T once, so autograd's
    backward stacks their gradients once instead of scattering into a full copy per step.
    """
    B, T, C = r.shape
    N = C // heads
    def rows(t):  # [B, T, C] -> T tensors [B*heads, N]
        return t.view(B, T, heads, N).transpose(0, 1).reshape(T, B * heads, N).unbind(0)

    rs, ds, ks, vs, as_, bs = (rows(t) for t in (r, decay, k, v, a, b))
    S = r.new_zeros(B * heads, N, N)
    ys = []
    for t in range(T):
        removed = torch.bmm(S, as_[t].unsqueeze(2))  # S a  [BH, N, 1]
        S = torch.baddbmm(S * ds[t].unsqueeze(1), removed, bs[t].unsqueeze(1))
        S = torch.baddbmm(S, vs[t].unsqueeze(2), ks[t].unsqueeze(1))
        ys.append(torch.bmm(S, rs[t].unsqueeze(2)).squeeze(2))  # [BH, N]
    y = torch.stack(ys)  # [T, BH, N]
    return y.view(T, B, heads, N).transpose(0, 1).reshape(B, T, C)


def _ramp(width: int, power: float) -> torch.Tensor:
    """1 - (i / C) ** power over the channels, shaped [1, 1, C]: token-shift mix init."""
    return (1.0 - torch.pow(torch.arange(width) / width, power)).view(1, 1, width)


def _vector(width: int, value) -> nn.Parameter:
    return nn.Parameter(torch.as_tensor(value, dtype=torch.float32).expand(1, 1, width).clone())


class TimeMix(nn.Module):
    def __init__(self, d: Dims, index: int):
        super().__init__()
        C, H, N = d.width, d.heads, d.head
        self.d, self.index = d, index
        depth = index / max(d.layers - 1, 1)  # 0 .. 1
        late = 1.0 - index / d.layers  # 1 .. ~0
        for m, power in zip(MIXES, (0.2, 0.9, 0.7, 0.7, 0.9, 0.2)):
            setattr(self, f"x_{m}", nn.Parameter(_ramp(C, power * late)))
        n = torch.arange(C, dtype=torch.float32)
        linear = n / (C - 1) - 0.5
        zigzag = ((n % N) - (N - 1) / 2) / ((N - 1) / 2)
        zigzag = zigzag * zigzag.abs()
        # Decays spread from fast to slow across channels, slower in deeper layers.
        w0 = -6 + 6 * (n / (C - 1)) ** (1 + depth**0.3) + 0.5 + 2.5 * zigzag
        self.w0 = _vector(C, w0)
        self.w1 = nn.Parameter(torch.zeros(C, d.decay_lora))
        self.w2 = nn.Parameter(nn.init.orthogonal_(torch.empty(d.decay_lora, C), gain=0.1))
        self.a0 = _vector(C, -0.19 + 0.3 * zigzag + 0.4 * linear)
        self.a1 = nn.Parameter(torch.zeros(C, d.a_lora))
        self.a2 = nn.Parameter(nn.init.orthogonal_(torch.empty(d.a_lora, C), gain=0.1))
        if index > 0:  # layer 0's v is v_first itself: it has no value-residual LoRA
            self.v0 = _vector(C, 0.73 - 0.4 * linear)
            self.v1 = nn.Parameter(torch.zeros(C, d.v_lora))
            self.v2 = nn.Parameter(nn.init.orthogonal_(torch.empty(d.v_lora, C), gain=0.1))
        self.g1 = nn.Parameter(torch.zeros(C, d.gate_lora))
        self.g2 = nn.Parameter(nn.init.orthogonal_(torch.empty(d.gate_lora, C), gain=0.1))
        self.k_k = _vector(C, 0.71 - 0.1 * linear)
        self.k_a = _vector(C, 1.02)
        self.r_k = nn.Parameter(torch.full((H, N), -0.04))
        self.receptance = nn.Linear(C, C, bias=False)
        self.key = nn.Linear(C, C, bias=False)
        self.value = nn.Linear(C, C, bias=False)
        self.output = nn.Linear(C, C, bias=False)
        bound = C**-0.5
        nn.init.uniform_(self.receptance.weight, -0.5 * bound, 0.5 * bound)
        nn.init.uniform_(self.key.weight, -0.05 * bound, 0.05 * bound)
        nn.init.uniform_(self.value.weight, -0.5 * bound, 0.5 * bound)
        nn.init.zeros_(self.output.weight)
        self.ln_x = nn.GroupNorm(H, C, eps=LN_X_EPS)
        nn.init.constant_(self.ln_x.weight, ((1 + index) / d.layers) ** 0.7)

    def forward(self, x: torch.Tensor, v_first: torch.Tensor | None):
        """x [B, T, C] (after ln1) -> (the time-mix output, v_first)."""
        B, T, C = x.shape
        H, N = self.d.heads, self.d.head
        delta = token_shift(x) - x
        xr, xw, xk, xv, xa, xg = (x + delta * getattr(self, f"x_{m}") for m in MIXES)
        r = self.receptance(xr)
        k = self.key(xk)
        v = self.value(xv)
        decay = torch.exp(-DECAY_SCALE * torch.sigmoid(self.w0 + torch.tanh(xw @ self.w1) @ self.w2))
        a = torch.sigmoid(self.a0 + (xa @ self.a1) @ self.a2)
        g = torch.sigmoid(xg @ self.g1) @ self.g2
        kk = F.normalize((k * self.k_k).view(B, T, H, N), dim=-1).view(B, T, C)
        k = k * (1 + (a - 1) * self.k_a)
        if self.index == 0:
            v_first = v
        else:
            v = v + (v_first - v) * torch.sigmoid(self.v0 + (xv @ self.v1) @ self.v2)
        y = wkv7(r, decay, k, v, -kk, kk * a, H)
        y = self.ln_x(y.reshape(B * T, C)).view(B, T, C)
        bonus = (r * k * self.r_k.view(1, 1, C)).view(B, T, H, N).sum(dim=-1, keepdim=True)
        y = y + (bonus * v.view(B, T, H, N)).view(B, T, C)
        return self.output(y * g), v_first


class ChannelMix(nn.Module):
    def __init__(self, d: Dims, index: int):
        super().__init__()
        self.x_k = nn.Parameter(_ramp(d.width, (1.0 - index / d.layers) ** 4))
        self.key = nn.Linear(d.width, d.ffn, bias=False)
        self.value = nn.Linear(d.ffn, d.width, bias=False)
        nn.init.uniform_(self.key.weight, -0.5 * d.width**-0.5, 0.5 * d.width**-0.5)
        nn.init.zeros_(self.value.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = torch.relu(self.key(x + (token_shift(x) - x) * self.x_k))
        return self.value(k * k)


class Block(nn.Module):
    def __init__(self, d: Dims, index: int):
        super().__init__()
        if index == 0:
            self.ln0 = nn.LayerNorm(d.width)
        self.ln1 = nn.LayerNorm(d.width)
        self.ln2 = nn.LayerNorm(d.width)
        self.att = TimeMix(d, index)
        self.ffn = ChannelMix(d, index)

    def forward(self, x, v_first):
        out, v_first = self.att(self.ln1(x), v_first)
        x = x + out
        return x + self.ffn(self.ln2(x)), v_first


class RWKV7(nn.Module):
    def __init__(self, d: Dims):
        super().__init__()
        self.d = d
        self.emb = nn.Embedding(d.vocab, d.width)
        nn.init.uniform_(self.emb.weight, -1e-4, 1e-4)  # ln0 normalises it
        self.blocks = nn.ModuleList(Block(d, i) for i in range(d.layers))
        self.ln_out = nn.LayerNorm(d.width)
        self.head = nn.Linear(d.width, d.vocab, bias=False)
        nn.init.orthogonal_(self.head.weight, gain=0.5 * math.sqrt(d.vocab / d.width))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] int64, every row from a zero state -> logits [B, T, vocab] fp32."""
        x = self.blocks[0].ln0(self.emb(ids))
        v_first = None
        for block in self.blocks:
            x, v_first = block(x, v_first)
        return self.head(self.ln_out(x))

    def decay_groups(self) -> list[dict]:
        """AdamW groups: weight decay on the projection matrices only (not on the embedding,
        norms, per-channel vectors, LoRA biases or r_k)."""
        decayed, plain = [], []
        for name, p in self.named_parameters():
            matrix = p.dim() == 2 and name.endswith(".weight") and not name.startswith("emb.")
            (decayed if matrix else plain).append(p)
        return [{"params": decayed}, {"params": plain, "weight_decay": 0.0}]
