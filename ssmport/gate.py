"""Run a bundle's teacher-forced gate and record it in the bundle."""

from __future__ import annotations

from ssmport.architectures import LoadedModel
from ssmport.bundle import GATE, Bundle, write_json_atomic
from ssmport.manifest import GateSummary
from ssmport.parity import GateReport, default_prompts, run_gate
from ssmport.progress import Stages
from ssmport.quant import get_recipe
from ssmport.quant.recipes import gate_thresholds
from ssmport.runtime import Runner
from ssmport.sources import rebuild_bundle_source
from ssmport.torch_runner import TorchRunner

DEFAULT_PROMPTS = 3
DEFAULT_STEPS = 32


def bundle_tokenizer(bundle: Bundle):
    if bundle.vocab_path is None:
        return None
    from ssmport.tokenizers import load_tokenizer

    return load_tokenizer(bundle.vocab_path)


def gate_bundle(
    bundle: Bundle,
    model: LoadedModel | None = None,
    *,
    prompts: int = DEFAULT_PROMPTS,
    steps: int = DEFAULT_STEPS,
    token_streams: list[list[int]] | None = None,
    weights=None,
    stages: Stages | None = None,
    record: bool = True,
) -> GateReport:
    """Gate `bundle` against the fp32 torch reference built from its source weights."""
    m = bundle.manifest
    recipe = get_recipe(m.recipe.name)
    if model is None:
        model = rebuild_bundle_source(m, weights)
    if token_streams is None:
        token_streams = default_prompts(
            model.config.vocab_size, prompts, steps, tokenizer=bundle_tokenizer(bundle)
        )
    stages = stages or Stages(enabled=False)
    total = sum(len(s) for s in token_streams)
    with stages.stage("Loading on Core AI runtime"):
        candidate = Runner(bundle)
        reference = TorchRunner(model, "fp32")
    try:
        with stages.stage(f"Gate ({total} teacher-forced steps)", total=total):
            report = run_gate(
                candidate, reference, token_streams, recipe.name,
                gate_thresholds(recipe, m.recipe.state_dtype, m.main.outputs[0].dtype),
                synthetic=model.synthetic, on_step=stages.advance,
            )  # fmt: skip
    finally:
        candidate.close()
        reference.close()
    if record:
        write_json_atomic(bundle.path / GATE, report.to_json())
        bundle.manifest.gate = GateSummary(**report.summary(), transcript=GATE)
        bundle.save_manifest()
    return report
