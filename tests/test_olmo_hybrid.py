"""OLMo-Hybrid against transformers' own `OlmoHybridForCausalLM` (pure-torch paths:
`hybrid_files.assert_torch_paths`) on tiny non-square configs written with `save_pretrained`
(tests/olmo_hybrid_files.py; beta pushed across (0, 2)): the reference loop and the export
form match its logits and cache; the fp32 bundle on the Core AI runtime within 2e-3 with every
top-1 equal and its states equal the cache; prefill exact against the M=1 loop; the chunk form
exact (float64) with beta up to 2; int8keepproj passes its gate; the three folder spellings
load the same weights; strict loading and config refusals are one line; the 7B preset counts
transformers' parameters."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from hybrid_checks import assert_close_to, differs, eager_logits, rewrite, tensors_of
from prefill_checks import CHUNK, assert_coreai_prefill_equals_m1_loop

import hybrid_files as hf
import olmo_hybrid_files as of
from ssmport.errors import SsmportError
from ssmport.exporter.pipeline import export
from ssmport.runtime import Runner
from ssmport.loader.resolve import load_checkpoint, load_model

TOKENS = [3, 17, 5, 60, 9, 11, 2, 44, 80, 7, 30, 12, 12, 12, 91, 0, 21, 8, 64]
CONTEXT = 128
TIED = replace(of.OlmoHybridDims(), tied=True, hidden=64, ffn=96)  # int8's block of 32 divides every width


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("olmo-hybrid")
    saved = of.write_olmo_hybrid(root / "saved", seed=1, beta_scale=4.0)
    return {"saved": saved, "released": of.respell(saved, root / "released", "released"),
            "transformers": of.respell(saved, root / "transformers", "transformers"),
            "tied": of.write_olmo_hybrid(root / "tied", TIED, seed=2, beta_scale=4.0)}  # fmt: skip


@pytest.fixture(scope="module")
def runs(folders):
    return {n: hf.reference_run(folders[n], TOKENS, model=of.load_transformers(folders[n])) for n in ("saved", "tied")}


@pytest.fixture(scope="module")
def bundles(folders, tmp_path_factory):
    out = tmp_path_factory.mktemp("olmo-hybrid-bundles")
    kw = {"progress": False, "context": CONTEXT, "prefill_chunk": CHUNK}
    return {"fp32": export(str(folders["saved"]), out, quant="fp32", **kw),
            "int8": export(str(folders["tied"]), out, quant="int8keepproj", name="int8", **kw)}  # fmt: skip


def _reference_logits(model, tokens):
    ref = model.architecture.reference(model.config, model.weights)
    state = ref.zero_state()
    return torch.stack([ref.step(t, state) for t in tokens]).numpy()


# --------------------------------------------------------------------------- vs transformers (torch)


@pytest.mark.parametrize("name", ["saved", "tied"])
def test_reference_and_export_form_match_transformers(folders, runs, name):
    model = load_checkpoint(folders[name])
    want = runs[name].step_logits.numpy()
    assert_close_to(_reference_logits(model, TOKENS), want)
    assert_close_to(eager_logits(model, TOKENS), want)


def test_the_three_spellings_load_the_same_weights(folders):
    """save_pretrained's OLMo-core names with equal conv parts, the released q / k / v split,
    transformers' in-memory names: one config, bit-equal canonical weights."""
    models = [load_checkpoint(folders[n]) for n in ("saved", "released", "transformers")]
    assert models[0].config == models[1].config == models[2].config and not models[0].config.tie_word_embeddings
    for name in models[0].weights:
        assert torch.equal(models[0].weights[name], models[1].weights[name]), name
        assert torch.equal(models[0].weights[name], models[2].weights[name]), name


def test_allow_neg_eigval_is_read(folders, runs, tmp_path):
    """linear_allow_neg_eigval=false (beta in (0, 1)) matches transformers too, and moves the logits."""
    folder = rewrite(folders["saved"], tmp_path / "pos", config_edit=lambda c: c.update(linear_allow_neg_eigval=False))
    model = load_checkpoint(folder)
    assert not model.config.delta_rule.allow_neg_eigval
    ours = eager_logits(model, TOKENS[:8])
    assert_close_to(ours, hf.reference_run(folder, TOKENS[:8], model=of.load_transformers(folder)).step_logits)
    assert differs(ours, runs["saved"].step_logits.numpy()[:8])


def test_chunk_form_is_exact_with_beta_up_to_2():
    """ops.delta_rule.chunk in float64 against the naive step, beta spread over (0, 2) with
    values at 1.99, 32 tokens (5 of them padding), 3 value heads: the negative eigenvalues
    (1 - beta |k|^2 down to -0.99) leave the WY form exact."""
    from ssmport.ops import delta_rule

    g = torch.Generator().manual_seed(0)
    T, valid, HV, dk, dv = 32, 27, 3, 8, 5
    k = torch.nn.functional.normalize(torch.randn(T, HV, dk, generator=g, dtype=torch.float64), dim=-1)
    q = torch.nn.functional.normalize(torch.randn(T, HV, dk, generator=g, dtype=torch.float64), dim=-1) * dk**-0.5
    v = torch.randn(T, HV, dv, generator=g, dtype=torch.float64)
    beta = 2 * torch.rand(T, HV, generator=g, dtype=torch.float64)
    beta[::4] = 1.99
    log_decay = -0.3 * torch.rand(T, HV, generator=g, dtype=torch.float64)
    S0 = torch.randn(HV, dk, dv, generator=g, dtype=torch.float64)
    S, O = delta_rule.chunk(S0, q, k, v, beta, log_decay, torch.tensor([valid]))
    want_S, want_O = S0.clone(), torch.zeros(valid, HV, dv, dtype=torch.float64)
    for t in range(valid):
        for j in range(HV):
            want_S[j], want_O[t, j] = delta_rule.naive_step(want_S[j], q[t, j], k[t, j], v[t, j], beta[t, j],
                                                            torch.exp(log_decay[t, j]))  # fmt: skip
    assert float((S - want_S).abs().max()) < 1e-10 * float(want_S.abs().max())
    assert float((O[:valid] - want_O).abs().max()) < 1e-10 * float(want_O.abs().max())


# --------------------------------------------------------------------------- Core AI


def test_fp32_bundle_matches_transformers(bundles, runs):
    want = runs["saved"].step_logits.numpy()
    with Runner(bundles["fp32"].path, prefill=False) as runner:
        got = runner.step_each(TOKENS)
        states = {n: runner.state(n) for n in runner.state_names}
    assert np.abs(got - want).max() <= 2e-3 and (got.argmax(-1) == want.argmax(-1)).all()
    cache = hf.stacked_states(runs["saved"].cache, CONTEXT)
    assert list(cache) == list(states) == ["keyCache", "valueCache", "convStates", "recurrentStates"]
    for name, value in cache.items():
        assert states[name].shape == tuple(value.shape), name
        assert np.abs(states[name] - value.numpy()).max() <= 1e-4 * max(1.0, float(value.abs().max())), name


def test_manifest_states_tokenizer_and_chat_template(bundles):
    """Apple's four states with the fixture's widths; the folder's tokenizer.json and its
    tokenizer_config.json chat template travel with the bundle, as Qwen3.5's do."""
    from ssmport.bundle import Bundle
    from ssmport.gate.run import bundle_tokenizer
    from ssmport.runtime.chat import chat_template

    m = bundles["fp32"].manifest
    assert m.architecture == "olmo_hybrid" and m.context == CONTEXT
    assert [(s.name, s.shape, s.kind) for s in m.states] == [
        ("keyCache", (2, 1, 2, -1, 12), "kv"), ("valueCache", (2, 1, 2, -1, 12), "kv"),  # grown up to CONTEXT
        ("convStates", (3, 1, 4, 2 * 2 * 8 + 4 * 12), "fixed"), ("recurrentStates", (3, 1, 4, 8, 12), "fixed"),
    ]  # fmt: skip
    assert [s.context for s in m.kv_states] == [CONTEXT, CONTEXT]
    assert m.tokenizer.config == "tokenizer/tokenizer_config.json" == m.tokenizer.chat_template
    bundle = Bundle.open(bundles["fp32"].path)
    t = chat_template(bundle, bundle_tokenizer(bundle))
    assert t.first_user == "<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("n", [1, CHUNK, 3 * CHUNK + 5])
def test_prefill_equals_the_m1_loop(bundles, n):
    assert_coreai_prefill_equals_m1_loop(bundles["fp32"].path, n)


def test_int8keepproj_passes_its_gate(bundles):
    """What the delta rule reads (q/k/v/a/b/g projections, conv, decays) and its out_proj stay
    float; attention projections, MLP and head are int8."""
    m = bundles["int8"].manifest
    assert m.gate.passed and m.recipe.name == "int8keepproj" and m.gate.max_rel_logit_delta > 0
    dtypes: dict[str, set] = {}
    for e in m.plan_tensors:
        dtypes.setdefault(e["role"], set()).add(e["dtype"])
    assert dtypes["ffn"] == dtypes["head"] == dtypes["attn_proj"] == {"int8"}
    assert dtypes["state_proj"] == dtypes["out_proj"] == dtypes["embedding"] == {"float16"}
    assert dtypes["conv"] == dtypes["decay"] == dtypes["norm"] == {"float32"}


def test_one_write_per_state_in_each_function():
    from ir_checks import writes_per_state

    from ssmport.exporter.convert import convert
    from ssmport.quant import get_recipe
    from ssmport.quant.plan import WeightBuilder

    model = load_model("olmo-hybrid-tiny")
    program = convert(model, WeightBuilder(get_recipe("fp32"), model.architecture.keeps_float), torch.float16,
                      prefill_chunk=CHUNK).program  # fmt: skip
    for function in ("main", "prefill"):
        assert writes_per_state(program, function, top_level_only=True) == {
            "keyCache": 1, "valueCache": 1, "convStates": 1, "recurrentStates": 1}


# --------------------------------------------------------------------------- strict loading, config


def _layer(i, rest):
    return f"model.layers.{i}.{rest}"


def test_strict_loading_names_every_bad_key(folders, tmp_path):
    t = tensors_of(folders["released"])
    gone, odd = _layer(0, "linear_attn.g_proj.weight"), _layer(2, "self_attn.q_norm.weight")
    bad = {k: v for k, v in t.items() if k != gone} | {"model.extra.weight": torch.zeros(2), odd: torch.zeros(12)}
    with pytest.raises(SsmportError) as err:
        load_checkpoint(rewrite(folders["released"], tmp_path / "bad", bad))
    msg = str(err.value)
    assert f"missing 1: {gone}" in msg and "unexpected 1: model.extra.weight" in msg and f"{odd} [12]" in msg
    assert "\n" not in msg
    split = {k: v for k, v in t.items() if k != _layer(1, "linear_attn.v_conv1d.weight")}
    with pytest.raises(SsmportError, match=r"split convs of model\.layers\.1\.linear_attn must be q_conv1d"):
        load_checkpoint(rewrite(folders["released"], tmp_path / "split", split))
    both = t | {_layer(3, "linear_attn.conv1d.weight"): torch.zeros(80, 1, 4)}
    with pytest.raises(SsmportError, match=r"and no conv1d; found .*model\.layers\.3\.linear_attn\.conv1d\.weight \[80, 1, 4\]"):
        load_checkpoint(rewrite(folders["released"], tmp_path / "both", both))
    headless = {k: v for k, v in t.items() if k != "lm_head.weight"}
    with pytest.raises(SsmportError, match="missing 1: lm_head.weight"):
        load_checkpoint(rewrite(folders["released"], tmp_path / "headless", headless))


def test_tied_head_is_the_embedding(folders):
    model = load_checkpoint(folders["tied"])
    assert model.config.tie_word_embeddings
    assert torch.equal(model.weights["lm_head.weight"], model.weights["model.embed_tokens.weight"])


REFUSALS = [
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "rope_type 'yarn'"),
    ({"layer_types": ["linear_attention"] * 5}, "no full_attention layer"),
    ({"layer_types": ["linear_attention", "sliding_attention"] * 2 + ["full_attention"]}, "sliding_attention"),
    ({"layer_types": ["full_attention"] * 4}, "layer_types has 4 entries"),
    ({"linear_num_value_heads": 3}, "not a multiple of linear_num_key_heads"),
    ({"num_hidden_layers": 10**6}, "num_hidden_layers=1000000 is outside"),
]  # fmt: skip


@pytest.mark.parametrize("edit, message", REFUSALS, ids=[m for _, m in REFUSALS])
def test_config_refusals_are_one_line(folders, tmp_path, edit, message):
    folder = rewrite(folders["saved"], tmp_path / "c", config_edit=lambda c: c.update(edit))
    with pytest.raises(SsmportError, match=message) as err:
        load_checkpoint(folder)
    assert "\n" not in str(err.value)


def test_defaults_follow_transformers():
    """Without layer_types, linear widths, kv heads or rope_parameters the config is
    transformers' (OlmoHybridConfig.__post_init__), down to a 3-layer stack's last-layer attention."""
    from transformers import OlmoHybridConfig

    from ssmport.models.olmo_hybrid.config import from_hf

    for layers in (3, 8):
        cj = {"model_type": "olmo_hybrid", "num_hidden_layers": layers, "hidden_size": 96, "num_attention_heads": 4,
              "vocab_size": 64, "intermediate_size": 32}  # fmt: skip
        ours, theirs = from_hf(cj, "cfg"), OlmoHybridConfig(**cj, pad_token_id=0, eos_token_id=1)
        assert list(ours.layer_types) == theirs.layer_types
        assert (ours.linear_num_key_heads, ours.linear_num_value_heads, ours.linear_key_head_dim, ours.linear_value_head_dim,
                ours.num_key_value_heads, ours.head_dim, ours.rope_theta) == (
            theirs.linear_num_key_heads, theirs.linear_num_value_heads, theirs.linear_key_head_dim,
            theirs.linear_value_head_dim, theirs.num_key_value_heads, 96 // 4, theirs.rope_parameters["rope_theta"])  # fmt: skip


def test_7b_preset_counts_transformers_parameters():
    from transformers import OlmoHybridConfig, OlmoHybridForCausalLM

    from ssmport.models.olmo_hybrid.checkpoints import canonical_shapes

    cfg = load_model("olmo-hybrid-7b", synthetic=True).config
    ours = sum(int(np.prod(s)) for s in canonical_shapes(cfg).values())
    with torch.device("meta"):
        theirs = sum(p.numel() for p in OlmoHybridForCausalLM(OlmoHybridConfig()).parameters())
    assert ours == theirs and cfg.context == 4096

