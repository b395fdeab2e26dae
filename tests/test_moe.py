"""Mixture-of-experts hybrids against transformers' own classes (pure-torch paths), on tiny
non-square fixtures where routing is non-trivial (tests/moe_files.py): LFM2-MoE
(`Lfm2MoeForCausalLM`: sigmoid scores, expert bias, dense first layer) and Qwen3.5-MoE
(`Qwen3_5MoeForCausalLM`: softmax scores, a gated shared expert in every layer).

One fp32 bundle with a prefill function per family: on the Core AI runtime its logits are
transformers' within 2e-3 with every top-1 equal, and prefill equals the M=1 loop. The experts
chosen per token (by the readable reference loop and by the export form) equal the ones
transformers' routers return; both checkpoint layouts load, strictly; int8keepproj passes its
gate with the experts in int8 and the router in float."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hybrid_checks import CORE_AI_ATOL, TOKENS, assert_close_to, eager_logits, rewrite, tensors_of
from prefill_checks import CHUNK, assert_coreai_prefill_equals_m1_loop, eager_modules

import hybrid_files as hf
import moe_files as mf
from ssmport.errors import CheckpointError
from ssmport.exporter import export
from ssmport.models import moe
from ssmport.runtime import Runner
from ssmport.sources import load_checkpoint

NEAR_TIE = 1e-5  # a choice between experts whose ranked scores are this close is not compared


@dataclass(frozen=True)
class MoeFamily:
    name: str
    write: object  # (folder) -> folder, with transformers' own class
    router: str  # transformers' router class (its output is captured)
    experts: str  # the experts' prefix in layer i, "{i}"
    weights: tuple[str, str, str]  # per-expert gate, up, down tensor names


FAMILIES = {
    "lfm2_moe": MoeFamily("lfm2_moe", lambda f: mf.write_lfm2_moe(f, seed=7), "Lfm2MoeTopKRouter",
                          "model.layers.{i}.feed_forward.experts.", ("w1", "w3", "w2")),
    "qwen3_5_moe": MoeFamily("qwen3_5_moe", lambda f: mf.write_qwen35_moe(f, seed=8), "Qwen3_5MoeTopKRouter",
                             "model.layers.{i}.mlp.experts.", ("gate_proj", "up_proj", "down_proj")),
}  # fmt: skip


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    return FAMILIES[request.param]


@pytest.fixture(scope="module")
def folder(family, tmp_path_factory):
    return family.write(tmp_path_factory.mktemp(family.name) / family.name)


@pytest.fixture(scope="module")
def reference(folder):
    return hf.reference_run(folder, TOKENS)


@pytest.fixture(scope="module")
def routing(folder, family):
    return mf.routed_experts(folder, TOKENS, family.router)


def moe_layers(cfg) -> range:
    return range(getattr(cfg, "num_dense_layers", 0), cfg.num_layers)


@pytest.fixture(scope="module")
def model(folder):
    return load_checkpoint(folder)


@pytest.fixture(scope="module")
def bundle(folder, tmp_path_factory):
    return export(str(folder), tmp_path_factory.mktemp("bundle"), quant="fp32", gate_steps=6, prefill_chunk=CHUNK,
                  progress=False)  # fmt: skip


def assert_same_choices(ours: list[list[int]], theirs: torch.Tensor, scores: torch.Tensor) -> None:
    """Per token, the same set of experts, unless the k-th and (k+1)-th ranked scores are a near-tie."""
    k, compared = theirs.shape[1], 0
    for t, chosen in enumerate(ours):
        ranked = scores[t].sort(descending=True).values
        if k < len(ranked) and ranked[k - 1] - ranked[k] < NEAR_TIE:
            continue
        assert sorted(chosen) == sorted(theirs[t].tolist()), f"token {t}"
        compared += 1
    assert compared >= len(ours) - 1


def test_routing_is_non_trivial(routing, model):
    """Every expert is chosen somewhere in the stream (and all but two in each MoE layer), in
    many distinct sets."""
    spec = model.config.moe
    assert len(routing) == len(moe_layers(model.config))
    assert set(torch.cat([chosen.flatten() for chosen, _ in routing]).tolist()) == set(range(spec.experts))
    for chosen, _ in routing:
        assert len(set(chosen.flatten().tolist())) >= spec.experts - 2
    sets = {tuple(sorted(row)) for chosen, _ in routing for row in chosen.tolist()}
    assert len(sets) >= 15


def test_fp32_bundle_matches_transformers(bundle, reference):
    assert bundle.manifest.gate.passed
    with Runner(bundle.path, prefill=False) as runner:
        ours = runner.step_each(TOKENS)
    theirs = reference.step_logits.numpy()
    assert np.abs(ours - theirs).max() <= CORE_AI_ATOL
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


def test_the_reference_loop_matches_transformers_and_routes_alike(model, reference, routing):
    ref = model.architecture.reference(model.config, model.weights)
    state = ref.zero_state()
    with torch.no_grad():
        ours = np.stack([ref.step(t, state).numpy() for t in TOKENS])
    assert_close_to(ours, reference.step_logits)
    moe_layers = sorted({i for i, _ in ref.chosen})
    for n, i in enumerate(moe_layers):
        assert_same_choices([c for j, c in ref.chosen if j == i], *routing[n])


def test_the_export_form_routes_alike(model, routing):
    """The eager decode module, fed token by token: each ExpertMixture's choice (from the input
    it was given) equals transformers' router's."""
    decode = eager_modules(model)[0]
    mixtures = [m for m in decode.modules() if isinstance(m, moe.ExpertMixture)]
    seen = {id(m): [] for m in mixtures}
    hooks = [m.register_forward_hook(lambda mod, args, out: seen[id(mod)].append(
        moe.route(mod.spec, args[0] @ mod.router, mod.bias if mod.spec.expert_bias else None)[0][0].tolist()))
        for m in mixtures]  # fmt: skip
    for name, _ in decode.named_buffers():
        getattr(decode, name).zero_()
    with torch.no_grad():
        for pos, t in enumerate(TOKENS):
            decode(torch.tensor([[t]], dtype=torch.int32), torch.tensor([[pos]], dtype=torch.int32))
    for h in hooks:
        h.remove()
    for m, (theirs, scores) in zip(mixtures, routing):
        assert_same_choices(seen[id(m)], theirs, scores)


@pytest.mark.parametrize("n", [CHUNK - 1, 2 * CHUNK + 3])
def test_prefill_equals_the_m1_loop(bundle, n):
    assert_coreai_prefill_equals_m1_loop(bundle.path, n)


def test_gathered_and_dense_forms_agree(model):
    """The two export forms of one MoE layer on the same rows (prefill picks one by size)."""
    decode = eager_modules(model)[0]
    mixture = next(m for m in decode.modules() if isinstance(m, moe.ExpertMixture))
    h = torch.randn(5, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        chosen, weights = moe.route(mixture.spec, h @ mixture.router, mixture.bias if mixture.spec.expert_bias else None)
        torch.testing.assert_close(mixture._gathered(h, chosen, weights), mixture._dense(h, chosen, weights))


def test_fused_layout_loads_the_same_model(folder, family, model, reference, tmp_path):
    """transformers' fused in-memory layout (gate_up_proj [E, 2F, C], down_proj [E, C, F])."""
    tensors, c = tensors_of(folder), model.config
    for i in moe_layers(c):
        p = family.experts.format(i=i)
        per = [[tensors.pop(f"{p}{e}.{w}.weight") for e in range(c.num_experts)] for w in family.weights]
        tensors[p + "gate_up_proj"] = torch.stack([torch.cat([g, u]) for g, u in zip(per[0], per[1])])
        tensors[p + "down_proj"] = torch.stack(per[2])
    fused = load_checkpoint(rewrite(folder, tmp_path / "fused", tensors))
    assert_close_to(eager_logits(fused, TOKENS), reference.step_logits)


def test_strict_loading_names_every_missing_and_unexpected_expert_tensor(folder, family, tmp_path):
    tensors, experts = tensors_of(folder), family.experts.format(i=2)
    router = family.experts.format(i=4).replace("experts.", "gate.weight")
    gone = [f"{experts}3.{family.weights[2]}.weight", router]
    extra = f"{experts}8.{family.weights[0]}.weight"
    for name in gone:
        del tensors[name]
    tensors[extra] = torch.zeros(32, 64)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(rewrite(folder, tmp_path / "bad", tensors))
    msg = str(info.value)
    assert "\n" not in msg
    for name in (*gone, extra):
        assert name in msg


@pytest.mark.parametrize("edit, says, only", [
    (lambda c: c.update(num_experts_per_tok=9), "num_experts_per_tok 9 is not in [1, num_experts=8]", None),
    (lambda c: c.update(num_experts=10 ** 5), "num_experts=100000 is outside", None),
    (lambda c: c.update(num_dense_layers=6), "num_dense_layers 6 > 5 layers", "lfm2_moe"),
    (lambda c: c.update(routed_scaling_factor="x"), "routed_scaling_factor='x' is not a number", "lfm2_moe"),
    (lambda c: c.update(hidden_act="gelu"), "hidden_act='gelu'", "qwen3_5_moe"),
])  # fmt: skip
def test_bad_configs_are_refused_in_one_line(folder, family, tmp_path, edit, says, only):
    if only not in (None, family.name):
        pytest.skip(f"a {only} key")
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(rewrite(folder, tmp_path / "bad", config_edit=edit))
    assert says in str(info.value) and "\n" not in str(info.value)


def test_int8keepproj_quantizes_experts_and_keeps_the_router(folder, tmp_path):
    b = export(str(folder), tmp_path / "int8", quant="int8keepproj", gate_steps=6, prefill_chunk=None, progress=False)
    assert b.manifest.gate.passed
    plan = b.manifest.plan_tensors
    stacks = [e for e in plan if e.get("rows_read")]
    assert stacks and all(e["dtype"] == "int8" and e["rows_read"] == 2 and e["shape"][0] == 8 for e in stacks)
    routers = [e for e in plan if e["role"] == "router"]
    assert routers and all(e["dtype"] == "float32" for e in routers)
