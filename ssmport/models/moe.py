"""The routed-expert (mixture-of-experts) MLP the MoE hybrids share, written once:

    logits = h W_router                                  [E] per token, fp32
    scores = softmax(logits) | sigmoid(logits)           the family's scoring
    choice = scores + expert_bias                        the bias moves the choice only
    groups: the experts in G equal groups, a group ranked by the sum of its two best choice
            scores; only the best topk_group groups' experts may be chosen (G = 1: all)
    chosen = top-k of choice
    w      = scores[chosen];  w /= sum(w) + eps (norm_topk);  w *= routed_scaling_factor
    out    = sum_j w_j * expert_j(h)                     expert: down(silu(gate h) * up h) (SwiGLU)
                                                         or down(relu(up h)^2) (gated=False)
           + sigmoid(h W_shared_gate) * shared(h)        shared expert, where the family has one

Each family's variant is a `MoeSpec` read from its config.json. The export form (`ExpertMixture`)
reads only the chosen experts' weights: the stacked [E, in, out] weights are gathered by index
(a gather `W[idx]`, no loop and no data-dependent control flow) and applied as one batched
matmul. A prefill chunk gathers per token too: running every expert over the chunk with a dense
[T, E] routing matrix (`_dense`) was slower on this runtime at every chunk size measured
(docs/hybrids.md, "Routed experts"). The gather copies the chosen experts' weights before the
matmuls read them; the `branched` decode form (`ExpertMixture.form`, export option `--experts
branched`) reads them in place, one `if` per expert, 2.7x faster on the Linux runtime at
LFM2-8B-A1B's widths but not the default: an `if` a device must decide on the host, E of them a
layer (benchmarks/moe_inplace.py). `moe_naive` is the readable twin: a loop over the chosen
experts of one token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ssmport.errors import SsmportError
from ssmport.loader.checkpoint import TensorSource
from ssmport.models.layers.mlp import ReluSquaredMLP, SwiGLU
from ssmport.models.loading import Stored
from ssmport.quant.plan import ExpertSlices, WeightBuilder
from ssmport.quant.roles import Role

SOFTMAX, SIGMOID = "softmax", "sigmoid"
GATHERED, BRANCHED = "gathered", "branched"  # the decode forms of `ExpertMixture` (EXPERT_FORMS)
EXPERT_FORMS = (GATHERED, BRANCHED)


@dataclass(frozen=True)
class MoeSpec:
    experts: int  # E
    top_k: int
    width: int  # each routed expert's SwiGLU width (moe_intermediate_size)
    scoring: str  # SOFTMAX | SIGMOID, over the router logits
    norm_topk: bool  # divide the chosen weights by their sum (+ norm_eps)
    norm_eps: float = 0.0  # LFM2-MoE adds 1e-6 to the sum; Qwen3.5-MoE divides by the bare sum
    scale: float = 1.0  # routed_scaling_factor
    expert_bias: bool = False  # a per-expert bias added to the scores for the choice only
    shared_width: int = 0  # 0: no shared expert
    shared_gate: bool = False  # the shared expert's output times sigmoid(h W_gate) [C -> 1]
    gated: bool = True  # SwiGLU experts (gate, up, down); False: relu^2 ones (up, down), shared alike
    groups: int = 1  # n_group: the experts in this many equal groups for the choice
    top_groups: int = 1  # topk_group: the groups a token's experts may come from

    def describe(self) -> str:
        shared = f" + shared {self.shared_width}{' gated' if self.shared_gate else ''}" if self.shared_width else ""
        grouped = f", {self.top_groups} of {self.groups} groups" if self.groups > 1 else ""
        act = "" if self.gated else " relu2"
        return f"{self.top_k} of {self.experts} experts x {self.width}{act} ({self.scoring}{grouped}){shared}"

    def problems(self) -> list[str]:
        """What makes this routing impossible (for the family's one-line refusal)."""
        found = [] if 1 <= self.top_k <= self.experts else [f"num_experts_per_tok {self.top_k} is not in [1, num_experts={self.experts}]"]
        if self.groups > 1:
            size = self.experts // self.groups
            if self.experts % self.groups or size < 2:
                found.append(f"n_group {self.groups} does not split {self.experts} experts into groups of 2 or more")
            elif not 1 <= self.top_groups <= self.groups:
                found.append(f"topk_group {self.top_groups} is not in [1, n_group={self.groups}]")
            elif self.top_k > self.top_groups * size:
                found.append(f"topk_group {self.top_groups} of {self.groups} groups of {size} cannot hold {self.top_k} experts")
        return found


@dataclass(frozen=True)
class MoeNames:
    """Canonical weight names of one MoE MLP: the router [E, C], the optional expert bias [E],
    expert e's gate / up [F, C] and down [C, F] (`expert(e)` -> (gate, up, down); gate None for
    relu^2 experts), and the shared expert's gate / up / down and gate [1, C] where there is one."""

    router: str
    expert_pattern: tuple[str | None, str, str]  # gate, up, down with "{e}" for the expert's index
    bias: str | None = None
    shared: tuple[str | None, str, str] | None = None
    shared_gate: str | None = None

    def expert(self, e: int) -> tuple[str | None, str, str]:
        return tuple(p and p.format(e=e) for p in self.expert_pattern)  # type: ignore[return-value]

    def stack(self, which: int) -> str:
        """The plan name of one stacked weight (0 gate, 1 up, 2 down) over every expert."""
        return self.expert_pattern[which].format(e="*")


def moe_shapes(spec: MoeSpec, names: MoeNames, hidden: int) -> dict[str, tuple[int, ...]]:
    C, Fe = hidden, spec.width
    shapes: dict[str, tuple[int, ...]] = {names.router: (spec.experts, C)}
    if spec.expert_bias:
        shapes[names.bias] = (spec.experts,)
    for e in range(spec.experts):
        shapes |= _mlp_shapes(names.expert(e), Fe, C)
    if spec.shared_width:
        shapes |= _mlp_shapes(names.shared, spec.shared_width, C)
    if spec.shared_gate:
        shapes[names.shared_gate] = (1, C)
    return shapes


def _mlp_shapes(names: tuple[str | None, str, str], width: int, hidden: int) -> dict[str, tuple[int, ...]]:
    gate, up, down = names
    return ({gate: (width, hidden)} if gate else {}) | {up: (width, hidden), down: (hidden, width)}


def fused_expert_storage(spec: MoeSpec, names: MoeNames, prefix: str, source: TensorSource, fused: str = "gate_up_proj",
                        down: str = "down_proj", always: bool = False) -> dict[str, tuple[str, Stored]]:  # fmt: skip
    """Where a checkpoint that stacks the experts keeps each expert's tensors: `{prefix}{fused}`
    [E, 2F, C] (gate rows, then up rows; [E, F, C] of up rows for relu^2 experts) and
    `{prefix}{down}` [E, C, F]. transformers' in-memory names by default; {} when the checkpoint
    has no such stack (one tensor per expert), unless `always` (a family released stacked)."""
    fused, down = prefix + fused, prefix + down
    if fused not in source and not always:
        return {}
    E, Fe, halves = spec.experts, spec.width, 2 if spec.gated else 1

    def rows(e: int, half: int) -> Stored:  # expert e's gate (0) or up (1) rows [F, C]
        return Stored(lambda s: ((E, halves * s[0], s[1]),), lambda t: t[e, half * Fe : (half + 1) * Fe].float())

    def expert(e: int) -> Stored:
        return Stored(lambda s: ((E, *s),), lambda t: t[e].float())

    storage = {}
    for e in range(E):
        gate, up, down_e = names.expert(e)
        storage |= ({gate: (fused, rows(e, 0))} if gate else {}) | {up: (fused, rows(e, halves - 1)), down_e: (down, expert(e))}
    return storage


def route(spec: MoeSpec, logits: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen experts [..., k] int, their weights [..., k] fp32) from router logits [..., E]."""
    scores = torch.softmax(logits, dim=-1) if spec.scoring == SOFTMAX else torch.sigmoid(logits)
    choice = scores + bias if bias is not None else scores
    if spec.groups > 1:
        grouped = choice.unflatten(-1, (spec.groups, spec.experts // spec.groups))  # [..., G, E/G]
        ranked = grouped.topk(2, dim=-1).values.sum(-1)  # [..., G]
        # a group is kept when it ranks in the top_groups (ties at the last place keep both)
        kept = ranked >= ranked.topk(spec.top_groups, dim=-1).values[..., -1:]
        choice = grouped.masked_fill(~kept.unsqueeze(-1), float("-inf")).flatten(-2)
    _, chosen = torch.topk(choice, spec.top_k, dim=-1)
    weights = torch.gather(scores, -1, chosen)
    if spec.norm_topk:
        weights = weights / (weights.sum(-1, keepdim=True) + spec.norm_eps)
    return chosen, weights * spec.scale if spec.scale != 1.0 else weights


class ExpertMixture(nn.Module):
    """The export form of `MoeSpec` on the normed input h [T, C] (returns [T, C]). `form`: how one
    token or chunk reads its experts, GATHERED or BRANCHED (`use_expert_form`)."""

    def __init__(self, spec: MoeSpec, names: MoeNames, src: TensorSource, b: WeightBuilder):
        super().__init__()
        self.spec, E = spec, spec.experts
        self.form = GATHERED
        # The router and the shared-expert gate are fp32 operands under every recipe (`vector`):
        # an fp16 or int8 logit flips near-tied choices, and they are a [C, E] sliver of the weights.
        self.router = b.vector(names.router, src[names.router].float().t(), Role.ROUTER)  # [C, E]
        if spec.expert_bias:
            self.bias = b.vector(names.bias, src[names.bias], Role.ROUTER)
        # gate | up of every expert as one stack [E, C, 2F] (up alone, [E, C, F], for relu^2), down [E, F, C]
        if spec.gated:
            gate_up = ExpertSlices(E, lambda e: torch.cat([src[names.expert(e)[0]], src[names.expert(e)[1]]]).t())
            self.gate_up = b.experts(f"{{{names.stack(0)},{names.stack(1)}}}", gate_up, Role.FFN, spec.top_k)
        else:
            gate_up = ExpertSlices(E, lambda e: src[names.expert(e)[1]].t())
            self.gate_up = b.experts(names.stack(1), gate_up, Role.FFN, spec.top_k)
        del gate_up
        down = ExpertSlices(E, lambda e: src[names.expert(e)[2]].t())
        self.down = b.experts(names.stack(2), down, Role.FFN, spec.top_k)
        del down
        if spec.shared_width:
            self.shared = SwiGLU(*names.shared, src, b) if spec.gated else ReluSquaredMLP(*names.shared[1:], src, b)
        if spec.shared_gate:
            self.shared_gate = b.vector(names.shared_gate, src[names.shared_gate].float().t(), Role.ROUTER)  # [C, 1]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        s = self.spec
        chosen, weights = route(s, h @ self.router, self.bias if s.expert_bias else None)
        if self.form == BRANCHED and self.gate_up.float_stack:
            out = self._branched(h, chosen, weights)
        else:  # at every T: faster than `_dense` up to 64 rows
            out = self._gathered(h, chosen, weights)
        if s.shared_width:
            shared = self.shared(h)
            out = out + (shared * torch.sigmoid(h @ self.shared_gate) if s.shared_gate else shared)
        return out

    def _gathered(self, h: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Each token's k experts: their weights gathered by index, one batched matmul each."""
        (T, C), k = h.shape, self.spec.top_k
        idx = chosen.reshape(T * k)
        dt = self.gate_up.dtype
        a = self._activate(self.gate_up.times(h.to(dt).view(T, 1, 1, C), idx).float())  # [T, k, 1, (2)F]
        y = self.down.times(a.to(dt), idx)  # [T, k, 1, C]
        return (y.float().view(T, k, C) * weights.view(T, k, 1)).sum(1)

    def _branched(self, h: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The T tokens' experts read in place: for each of the E experts, an `if` taken when any
        token chose it, whose matmuls read W[e] with a static e over all T rows, each row weighted
        by its token's routing weight (0: not chosen). The converter stores each W[e] as a
        constant of its own, so the decode and prefill functions share those E constants and the
        stack is stored once (a gathering prefill beside a branched decode stored it twice:
        lfm2-moe-tiny 8.49 vs 5.30 MB). On the Linux runtime this is where a decode token gains
        (the gather W[idx] copies the k experts first; a slice at a runtime index,
        W.narrow(0, idx[j].item(), 1), copies at ~0.3 GB/s): benchmarks/moe_inplace.py, one
        LFM2-8B-A1B layer 37.2 -> 13.8 ms. A chunk runs every expert some token chose over all
        its rows: the dense form's multiply-adds, each expert read once."""
        x, routing = h.to(self.gate_up.dtype), self._routing(chosen, weights)  # [T, E]
        one_token = isinstance(h.shape[0], int) and h.shape[0] == 1
        # A token's predicate reads the weight's own slice (one `!=` an expert); a chunk's, one
        # `any` for the layer. Comparing the whole row once is no cheaper for a token: each
        # expert's predicate is then a slice of its own (measured: lfm2-moe-tiny 531 -> 547 ops).
        taken = None if one_token else (routing != 0).any(0)  # [E]
        out = torch.zeros_like(h)
        for e in range(self.spec.experts):
            weight = routing[:, e : e + 1]  # [T, 1]
            operands = (out, x, weight, self.gate_up.weight[e], self.down.weight[e])
            out = torch.cond(weight[0, 0] != 0 if one_token else taken[e], self._add_expert, _unchanged, operands)
        return out

    def _add_expert(self, out, x, weight, gate_up, down) -> torch.Tensor:
        """out + weight * the expert with these weights, of the tokens x [T, C] (weight [T, 1])."""
        a = self._activate((x @ gate_up).float())
        return out + weight * (a.to(down.dtype) @ down).float()

    def _routing(self, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The dense routing matrix [T, E]: each token's weight of each expert (0: not chosen)."""
        experts = torch.arange(self.spec.experts, dtype=chosen.dtype, device=chosen.device)
        return ((chosen.unsqueeze(-1) == experts).to(weights.dtype) * weights.unsqueeze(-1)).sum(1)

    def _activate(self, a: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of the [gate | up] rows, or relu(up)^2 (as x * x: no pow on the runtime path)."""
        if self.spec.gated:
            g, u = a.split([self.spec.width] * 2, dim=-1)
            return F.silu(g) * u
        r = torch.relu(a)
        return r * r

    def _dense(self, h: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Every expert over the chunk, weighted by the dense routing matrix [T, E]: the form a
        chunk could take whose tokens between them choose every expert. Not used: slower than
        gathering on this runtime even at 64 rows x 4 of 32 experts (2.19 s vs 3.04 s per call,
        benchmarks/moe_forms.py); kept for that measurement and as the gathered form's check."""
        dt = self.gate_up.dtype
        a = self._activate((h.to(dt).unsqueeze(0) @ self.gate_up.whole()).float())  # [E, T, F]
        y = (a.to(dt) @ self.down.whole()).float()  # [E, T, C]
        return (y * self._routing(chosen, weights).t().unsqueeze(-1)).sum(0)


def _unchanged(out, x, weight, gate_up, down) -> torch.Tensor:
    return out.clone()  # a torch.cond branch may not return its operand itself


def use_expert_form(module: nn.Module, form: str) -> None:
    """Every `ExpertMixture` in `module` reads its tokens' experts in `form` (EXPERT_FORMS).
    BRANCHED reads float expert stacks only: a model with none is refused in one line, so a
    manifest never says "branched" of a graph that gathers."""
    if form not in EXPERT_FORMS:
        raise ValueError(f"unknown expert form {form!r}; choose {' or '.join(EXPERT_FORMS)}")
    mixtures = [m for m in module.modules() if isinstance(m, ExpertMixture)]
    if form == BRANCHED and not any(m.gate_up.float_stack for m in mixtures):
        raise SsmportError("--experts branched needs routed experts stored in float (fp32 or fp16): "
                           + ("this model has no routed experts" if not mixtures else
                              "this recipe stores them as integers; use --quant fp32 or fp16, or --experts gathered"))
    for m in mixtures:
        m.form = form


def moe_naive(spec: MoeSpec, names: MoeNames, w, h: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """One token through the MoE MLP, written for reading: (out [C], the chosen experts).
    `w`: canonical name -> fp32 tensor ([out, in])."""
    logits = w[names.router] @ h
    scores = torch.softmax(logits, dim=-1) if spec.scoring == SOFTMAX else torch.sigmoid(logits)
    choice = scores + w[names.bias] if spec.expert_bias else scores
    best = lambda experts: sorted(experts, key=lambda e: -float(choice[e]))  # noqa: E731
    candidates, size = range(spec.experts), spec.experts // spec.groups
    if spec.groups > 1:
        rank = {g: sum(float(choice[e]) for e in best(range(g * size, (g + 1) * size))[:2]) for g in range(spec.groups)}
        kept = sorted(rank, key=lambda g: -rank[g])[: spec.top_groups]
        candidates = [e for e in candidates if e // size in kept]
    chosen = best(candidates)[: spec.top_k]
    weights = [float(scores[e]) for e in chosen]
    total = sum(weights) + spec.norm_eps if spec.norm_topk else 1.0
    out = torch.zeros_like(h)
    for e, weight in zip(chosen, weights):
        out = out + (weight / total * spec.scale) * _mlp_naive(spec, [w[n] if n else None for n in names.expert(e)], h)
    if spec.shared_width:
        shared = _mlp_naive(spec, [w[n] if n else None for n in names.shared], h)
        out = out + (torch.sigmoid(w[names.shared_gate] @ h) * shared if spec.shared_gate else shared)
    return out, chosen


def _mlp_naive(spec: MoeSpec, weights, h: torch.Tensor) -> torch.Tensor:
    gate, up, down = weights
    return down @ (F.silu(gate @ h) * (up @ h) if spec.gated else torch.relu(up @ h) ** 2)


class RoutedReference:
    """A reference mixin: `routed` runs `moe_naive` over the reference's fp32 weights `self.w`
    and keeps each choice in `self.chosen` ([(layer, [experts])], in call order)."""

    def routed(self, i: int, spec: MoeSpec, names: MoeNames, h: torch.Tensor) -> torch.Tensor:
        out, experts = moe_naive(spec, names, self.w, h)
        self.__dict__.setdefault("chosen", []).append((i, experts))
        return out
