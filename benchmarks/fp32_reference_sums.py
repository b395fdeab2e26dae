"""The fp32 export-form module run eagerly (TorchRunner: the gates' reference side) against the
plain reference loop in fp64, first `--layers` layers of a preset (synthetic weights), with
and without `ssmport.ops.matmul.reference_sums` (docs/quantization.md, "The fp32 reference's
sums"). Prints each form's max |Δlogits| over the steps, relative to the fp64 logit scale.

    python benchmarks/fp32_reference_sums.py rwkv6-1.6b --layers 4
    flock /tmp/ssmport-heavy.lock python benchmarks/fp32_reference_sums.py rwkv6-1.6b --layers 12
    python benchmarks/fp32_reference_sums.py rwkv7-1.5b --layers 4
    flock /tmp/ssmport-heavy.lock python benchmarks/fp32_reference_sums.py rwkv6-1.6b --layers 4 --coreai
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from ssmport.ops.matmul import reference_sums
from ssmport.loader.resolve import DEFAULT_SEED, load_model
from ssmport.gate.torch_runner import TorchRunner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--coreai", action="store_true", help="also export the fp32 bundle and run it on Core AI")
    args = ap.parse_args()
    m = load_model(args.preset, synthetic=True, seed=DEFAULT_SEED)
    cfg = dataclasses.replace(m.config, num_layers=args.layers)
    weights = m.architecture.synthetic_weights(cfg, DEFAULT_SEED)  # drawn in fp32 (the default dtype)
    model = dataclasses.replace(m, config=cfg, weights=weights)
    tokens = torch.randint(0, cfg.vocab_size, (args.steps,), generator=torch.Generator().manual_seed(1)).tolist()

    ref = m.architecture.reference(cfg, weights)
    state = ref.zero_state()
    loop32 = torch.stack([ref.step(t, state) for t in tokens]).double()
    torch.set_default_dtype(torch.float64)  # the loop's zero state and temporaries in fp64 too
    try:
        ref.w = {k: v.double() for k, v in ref.w.items()}
        ref.att = [{k: v.double() for k, v in a.items()} for a in ref.att]
        state = ref.zero_state()
        loop64 = torch.stack([ref.step(t, state) for t in tokens])
    finally:
        torch.set_default_dtype(torch.float32)
    del ref
    scale = loop64.abs().max().item()
    rel = lambda a: (a - loop64).abs().max().item() / scale  # noqa: E731

    plain = torch.tensor(TorchRunner(model).step_each(tokens)).double()  # the export form's x @ W
    with reference_sums():
        summed = torch.tensor(TorchRunner(model).step_each(tokens)).double()
    if args.coreai:
        import tempfile

        from ssmport.exporter.pipeline import export
        from ssmport.runtime import Runner

        with tempfile.TemporaryDirectory() as out:
            with Runner(export(model, out, quant="fp32", progress=False).path) as runner:
                coreai = torch.tensor(runner.step_each(tokens)).double()
        apart = lambda a, b: (a - b).abs().max().item() / scale  # noqa: E731
        print(f"Core AI vs the fp64 loop {rel(coreai):.2e}, vs the module's plain sums {apart(coreai, plain):.2e}, "
              f"vs its reference_sums {apart(coreai, summed):.2e}")
    print(f"{args.preset} first {args.layers} layers, {args.steps} steps, logit scale {scale:.2f}: vs the fp64 loop, "
          f"loop fp32 {rel(loop32):.2e}, module plain sums {rel(plain):.2e}, module reference_sums {rel(summed):.2e}")


if __name__ == "__main__":
    main()
