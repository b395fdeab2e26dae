"""Mixture-of-experts hybrids against transformers' own classes (pure-torch paths), on tiny
non-square fixtures where routing is non-trivial (tests/moe_files.py): LFM2-MoE
(`Lfm2MoeForCausalLM`: sigmoid scores, expert bias, dense first layer), Qwen3.5-MoE
(`Qwen3_5MoeForCausalLM`: softmax scores, a gated shared expert in every layer), Nemotron-H
with MoE layers (`NemotronHForCausalLM`: sigmoid scores with a correction bias, grouped top-k,
relu^2 experts and shared expert, routed scaling) and Granite-4.0-H with experts
(`GraniteMoeHybridForCausalLM`: softmax of the top-k logits, stacked experts beside the shared MLP).

One fp32 bundle with a prefill function per family: on the Core AI runtime its logits are
transformers' within 2e-3 with every top-1 equal, and prefill equals the M=1 loop. The experts
chosen per token (by the readable reference loop and by the export form) equal the ones
transformers' routers return; both checkpoint layouts load, strictly; int8keepproj passes its
gate with the experts in int8 and the router in float, int4keepproj passes its own."""

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
from ssmport.exporter.pipeline import export
from ssmport.models import moe
from ssmport.runtime import Runner
from ssmport.loader.resolve import load_checkpoint

NEAR_TIE = 1e-5  # a choice between experts whose ranked scores are this close is not compared


@dataclass(frozen=True)
class MoeFamily:
    name: str
    write: object  # (folder) -> folder, with transformers' own class
    router: str  # transformers' router class (its output is captured)
    experts: str  # the experts' prefix in layer i, "{i}"
    weights: tuple[str, ...]  # per-expert (gate,) up, down tensor names; () where released stacked
    router_weight: str  # the router's tensor in layer i, "{i}"
    chat: str  # hybrid_files.CHAT_TOKENS key: the fixture tokenizer's chat markers
    stacked: tuple[str, str] = ("gate_up_proj", "down_proj")  # the stacks (after `experts`) of the fused layout
    experts_key: str = "num_experts"  # config.json's expert count


FAMILIES = {
    "lfm2_moe": MoeFamily("lfm2_moe", lambda f: mf.write_lfm2_moe(f, seed=7), "Lfm2MoeTopKRouter",
                          "model.layers.{i}.feed_forward.experts.", ("w1", "w3", "w2"),
                          "model.layers.{i}.feed_forward.gate.weight", "lfm2"),
    "qwen3_5_moe": MoeFamily("qwen3_5_moe", lambda f: mf.write_qwen35_moe(f, seed=8), "Qwen3_5MoeTopKRouter",
                             "model.layers.{i}.mlp.experts.", ("gate_proj", "up_proj", "down_proj"),
                             "model.layers.{i}.mlp.gate.weight", "qwen3_5"),
    "nemotron_h": MoeFamily("nemotron_h", lambda f: mf.write_nemotron_moe(f, seed=11), "NemotronHTopkRouter",
                            "backbone.layers.{i}.mixer.experts.", ("up_proj", "down_proj"),
                            "backbone.layers.{i}.mixer.gate.weight", "nemotron_h", ("up_proj", "down_proj"),
                            "n_routed_experts"),
    "granitemoehybrid": MoeFamily("granitemoehybrid", lambda f: mf.write_granite_moe(f, seed=10),
                                  "GraniteMoeHybridTopKRouter", "model.layers.{i}.block_sparse_moe.", (),
                                  "model.layers.{i}.block_sparse_moe.router.layer.weight", "granite",
                                  ("input_linear.weight", "output_linear.weight"), "num_local_experts"),
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


def moe_layers(cfg) -> list[int]:
    return [i for i in range(cfg.num_layers) if getattr(cfg, "is_moe", lambda i: True)(i)]


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
    if spec.groups > 1:  # the groups decide: some tokens' choice is not the ungrouped top-k
        assert any(set(chosen[t].tolist()) != set(scores[t].topk(spec.top_k).indices.tolist())
                   for chosen, scores in routing for t in range(len(chosen)))  # fmt: skip


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


def test_the_chat_template_travels_with_the_bundle(bundle, family):
    """The folder's tokenizer_config.json (its chat template) is copied; ssmport's chat reads it."""
    from ssmport.bundle import Bundle
    from ssmport.gate.run import bundle_tokenizer
    from ssmport.runtime.chat import chat_template

    start, end, _ = hf.CHAT_TOKENS[family.chat]
    assert bundle.manifest.tokenizer.chat_template == "tokenizer/tokenizer_config.json"
    opened = Bundle.open(bundle.path)
    t = chat_template(opened, bundle_tokenizer(opened))
    assert t.first_user == f"{start}user\n{{message}}{end}\n{start}assistant\n"


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


def test_the_branched_form_equals_a_loop_over_the_chosen_experts(model):
    """The branched form (an `if` per expert, reading W[e] in place) of every MoE layer, for one
    token and for a chunk, equals a Python loop over each token's chosen experts on the same
    stored weights, and the gathered form."""
    decode = eager_modules(model)[0]
    mixtures = [m for m in decode.modules() if isinstance(m, moe.ExpertMixture)]
    g = torch.Generator().manual_seed(1)
    for m in mixtures:
        for rows in (1, 1, 1, 6):
            h = torch.randn(rows, model.config.hidden_size, generator=g)
            with torch.no_grad():
                chosen, weights = moe.route(m.spec, h @ m.router, m.bias if m.spec.expert_bias else None)
                loop = torch.zeros_like(h)
                for t in range(rows):
                    for e, w in zip(chosen[t].tolist(), weights[t].tolist()):
                        loop[t] += w * (m._activate(h[t : t + 1] @ m.gate_up.weight[e]) @ m.down.weight[e])[0]
                branched = m._branched(h, chosen, weights)
                torch.testing.assert_close(branched, loop, rtol=0, atol=1e-6 * float(loop.abs().max()))
                torch.testing.assert_close(branched, m._gathered(h, chosen, weights))


def test_branched_bundle_matches_transformers(family, folder, reference, bundle, tmp_path, monkeypatch):
    """--experts branched: the decode and prefill graphs hold an `if` per expert of every MoE
    layer, the bundle meets transformers as the default bundle does, its prefill equals its M=1
    loop, and the expert stacks are stored once (the per-expert constants W[e] are shared by the
    two functions: a gathering prefill beside a branched decode stored them twice). Two
    families' bundles (sigmoid routing; softmax with a gated shared expert): the branched form
    is ExpertMixture's alone, and the test above checks it in all four in torch (CI time)."""
    if family.name not in ("lfm2_moe", "qwen3_5_moe"):
        pytest.skip("the branched form is family-independent; its bundle is checked on lfm2_moe and qwen3_5_moe")
    from ir_checks import graph_texts

    from ssmport.bundle import dir_bytes
    from ssmport.exporter.convert import convert
    from ssmport.quant import get_recipe
    from ssmport.quant.plan import WeightBuilder

    branched = export(str(folder), tmp_path, quant="fp32", gate=False, prefill_chunk=CHUNK, experts="branched",
                      progress=False)  # fmt: skip
    assert branched.manifest.export["experts"] == "branched"
    with Runner(branched.path, prefill=False) as runner:
        ours = runner.step_each(TOKENS)
    theirs = reference.step_logits.numpy()
    assert np.abs(ours - theirs).max() <= CORE_AI_ATOL
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()
    assert_coreai_prefill_equals_m1_loop(branched.path, CHUNK + 3)
    check_branched_prompt_path(branched, bundle, monkeypatch)
    # stored once: the assets differ by graph text, not by a second copy of the expert stacks
    stacks = sum(e["bytes"] for e in branched.manifest.plan_tensors if e.get("rows_read"))
    assert stacks > 0 and abs(dir_bytes(branched.path) - dir_bytes(bundle.path)) < stacks / 4
    model = load_checkpoint(folder)
    arch = model.architecture
    program = convert(model, WeightBuilder(get_recipe("fp32"), arch.keeps_float), torch.float32, prefill_chunk=CHUNK,
                      experts="branched").program  # fmt: skip
    mixtures = [m for m in eager_modules(model)[0].modules() if isinstance(m, moe.ExpertMixture)]
    texts = graph_texts(program)
    assert texts["main"].count("coreai.if") == texts["prefill"].count("coreai.if") == sum(m.spec.experts for m in mixtures) > 0


def check_branched_prompt_path(branched, gathered, monkeypatch) -> None:
    """A Runner's prompts (ssmport.runtime.prompt_path): a tiny branched bundle's chunks pay, so
    they go through prefill; with the limit at its largest expert matrix (as for released
    experts, which the rule sends the other way) through main one token a call, to the same
    logits, while a gathered bundle and an explicit prefill=True keep the chunks."""
    from ssmport.runtime import prompt_path

    m = branched.manifest
    largest = prompt_path.largest_expert_matrix(m)
    assert 0 < largest < prompt_path.BRANCHED_CHUNK_LIMIT and prompt_path.prompts_through_prefill(m)
    monkeypatch.setattr(prompt_path, "BRANCHED_CHUNK_LIMIT", largest)
    assert not prompt_path.prompts_through_prefill(m) and prompt_path.prompts_through_prefill(gathered.manifest)
    prompt = TOKENS + TOKENS[:CHUNK - 3]  # three chunks, the last one padded
    with Runner(branched.path) as one_by_one, Runner(branched.path, prefill=True) as chunked:
        assert not one_by_one.has_prefill and chunked.has_prefill
        np.testing.assert_allclose(one_by_one.feed(prompt), chunked.feed(prompt), rtol=0, atol=CORE_AI_ATOL)
        assert one_by_one.tokens == chunked.tokens == prompt


def test_fused_layout_loads_the_same_model(folder, family, model, reference, tmp_path):
    """transformers' fused in-memory layout (gate_up_proj [E, 2F, C] or up_proj [E, F, C] of
    relu^2 experts, down_proj [E, C, F]); Granite's released layout is stacked already."""
    if not family.weights:
        pytest.skip("released stacked: the fixture itself is this layout")
    tensors, spec = tensors_of(folder), model.config.moe
    for i in moe_layers(model.config):
        p = family.experts.format(i=i)
        per = [[tensors.pop(f"{p}{e}.{w}.weight") for e in range(spec.experts)] for w in family.weights]
        tensors[p + family.stacked[0]] = torch.stack([torch.cat(rows) for rows in zip(*per[:-1])])
        tensors[p + family.stacked[1]] = torch.stack(per[-1])
    fused = load_checkpoint(rewrite(folder, tmp_path / "fused", tensors))
    assert_close_to(eager_logits(fused, TOKENS), reference.step_logits)


def test_strict_loading_names_every_missing_and_unexpected_expert_tensor(folder, family, model, tmp_path):
    tensors, experts, spec = tensors_of(folder), family.experts.format(i=2), model.config.moe
    if family.weights:  # an expert's down gone; one expert too many
        gone = [f"{experts}3.{family.weights[-1]}.weight", family.router_weight.format(i=4)]
        extra = f"{experts}{spec.experts}.{family.weights[0]}.weight"
    else:  # a layer's stacked down gone; transformers' in-memory name of the stack, unexpected here
        gone = [experts + family.stacked[1], family.router_weight.format(i=4)]
        extra = experts + "experts.gate_up_proj"
    for name in gone:
        del tensors[name]
    tensors[extra] = torch.zeros(spec.width, model.config.hidden_size)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(rewrite(folder, tmp_path / "bad", tensors))
    msg = str(info.value)
    assert "\n" not in msg
    for name in (*gone, extra):
        assert name in msg


@pytest.mark.parametrize("edit, says, only", [
    (lambda c: c.update(num_experts_per_tok=9), "num_experts_per_tok 9 is not in [1, num_experts=8]",
     ("lfm2_moe", "qwen3_5_moe", "granitemoehybrid")),
    (lambda c: c.update(num_experts_per_tok=13), "num_experts_per_tok 13 is not in [1, num_experts=12]", ("nemotron_h",)),
    ("experts_key", "=100000 is outside", None),
    (lambda c: c.update(num_dense_layers=6), "num_dense_layers 6 > 5 layers", ("lfm2_moe",)),
    (lambda c: c.update(routed_scaling_factor="x"), "routed_scaling_factor='x' is not a number", ("lfm2_moe", "nemotron_h")),
    (lambda c: c.update(hidden_act="gelu"), "hidden_act='gelu'", ("qwen3_5_moe", "granitemoehybrid")),
    (lambda c: c.update(moe_latent_size=32), "moe_latent_size=32 (a latent expert projection: not implemented)", ("nemotron_h",)),
    (lambda c: c.update(n_shared_experts=2), "n_shared_experts=2 (transformers builds one shared expert)", ("nemotron_h",)),
    (lambda c: c.update(n_group=5), "n_group 5 does not split 12 experts into groups of 2 or more", ("nemotron_h",)),
    (lambda c: c.update(topk_group=4), "topk_group 4 is not in [1, n_group=3]", ("nemotron_h",)),
    (lambda c: c.update(num_experts_per_tok=9), "topk_group 2 of 3 groups of 4 cannot hold 9 experts", ("nemotron_h",)),
    (lambda c: c.update(mlp_hidden_act="silu"), "mlp_hidden_act='silu' (relu2 only)", ("nemotron_h",)),
])  # fmt: skip
def test_bad_configs_are_refused_in_one_line(folder, family, tmp_path, edit, says, only):
    if only is not None and family.name not in only:
        pytest.skip(f"keys of {only}")
    if edit == "experts_key":
        edit = lambda c: c.update({family.experts_key: 10**5})  # noqa: E731
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(rewrite(folder, tmp_path / "bad", config_edit=edit))
    assert says in str(info.value) and "\n" not in str(info.value)


# int4keepproj fails its gate on three of these fixtures, from the first step on (measured
# 2026-12-04: lfm2_moe 0.642, qwen3_5_moe 0.664, nemotron_h 0.542 of the logit scale against
# 0.3; granitemoehybrid 0.006). Diagnosed, not a bug: the fixtures' layers write updates as large
# as the residual and int4 noise flips their random top-2 routing; Granite's multipliers shrink
# each update to 0.02 of the residual (docs/quantization.md, benchmarks/int4_ablation.py).
# int4keepproj on those three families is tested on trained weights instead: tests/test_trained_moe.py
# (tests/data/{lfm2_moe,qwen3_5_moe,nemotron_h_moe}_pydoc: gate passed, confident top-1s kept,
# 4-bit experts).
@pytest.mark.parametrize("quant", ["int8keepproj", "int4keepproj"])
def test_quantized_recipes_pass_their_gates_with_the_router_in_float(folder, family, model, tmp_path, quant):
    if quant == "int4keepproj" and family.name != "granitemoehybrid":
        pytest.skip("int4keepproj fails its gate on this fixture (measured; see above)")
    b = export(str(folder), tmp_path / quant, quant=quant, gate_steps=6, prefill_chunk=None, progress=False)
    assert b.manifest.gate.passed
    plan, spec = b.manifest.plan_tensors, model.config.moe
    stacks = [e for e in plan if e.get("rows_read")]
    assert len(stacks) == 2 * len(moe_layers(model.config))
    # int4keepproj's experts are 4-bit where trained weights measured them safe, else int8
    # (quant.plan.WeightBuilder.experts)
    four_bit = quant == "int4keepproj" and model.architecture.int4_safe_experts
    assert all(e["dtype"] == ("int4" if four_bit else "int8") and e["rows_read"] == spec.top_k
               and e["shape"][0] == spec.experts for e in stacks)  # fmt: skip
    routers = [e for e in plan if e["role"] == "router"]
    assert routers and all(e["dtype"] == "float32" for e in routers)
