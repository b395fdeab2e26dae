"""Can an embedding read its rows from an int8 LM head's constant? (the int8 case of ssmport.quant.tied)

One graph: a token id -> its table row (dequantized) -> `x @ dequant(Q, S)`, the head an
`Int8Matmul` (Q int8 [C, V], fp16 scales [C/32, V], the converter's constexpr dequantization).
The row is read in each FORM below from the head's own Q and S (the table's row v is the head's
column v), or, for the baseline, from a table of its own (`QuantizedTable`, the int8 table an
`auto` plan stores). For each form: converted or refused, the asset's bytes (against the head
alone: does the table add its V x C bytes again?), the Core AI runtime's logits against torch's,
and the kernels of one call (the runtime profiler).

    python benchmarks/tied_int8_forms.py --vocab 4096 --width 256 --json benchmarks/results/tied_int8_forms.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ssmport.ops.matmul import Int8Matmul, QuantizedTable
from ssmport.quant.blockwise import quantize_blockwise
from ssmport.runtime.op_count import OpLog, summarize


def _dequantize_row(levels: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """levels [T, C] and scales [T, C/32] -> rows [T, C] fp32 (as QuantizedTable.rows)."""
    blocks = scale.shape[-1]
    return (levels.float().unflatten(-1, (blocks, -1)) * scale.float().unsqueeze(-1)).flatten(-2)


# Each form reads columns `ids` [T] of the head's Q [C, V] and S [C/32, V] as rows [T, C] / [T, C/32]
# (one scale a block, dequantized as QuantizedTable.rows does); SHIPPED gathers a scale per level.
def flat_gather(m: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """One gather from the flattened constant (FloatMatmul.columns' form)."""
    n_rows, width = m.shape
    flat = ids.long().view(-1, 1) + torch.arange(n_rows).view(1, n_rows) * width
    return m.reshape(-1)[flat]


def index_columns(m: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """m[:, ids].t(): an index behind a slice."""
    return m[:, ids.long()].t()


def index_select_columns(m: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.index_select(m, 1, ids.long()).t()


def transposed_rows(m: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """m.t()[ids]: the transposed constant indexed by row."""
    return m.t()[ids.long()]


SHIPPED = "BlockwiseMatmul.columns"  # the form ssmport.quant.tied uses: flat gathers, a scale per level
FORMS = {"flat_gather": flat_gather, "index_columns": index_columns,
         "index_select": index_select_columns, "transposed_rows": transposed_rows}  # fmt: skip


class TiedInt8(nn.Module):
    """forward(ids [1]) -> logits [1, V]; the row read from the head (`form`) or its own table."""

    def __init__(self, head: Int8Matmul, form: str | None, table: QuantizedTable | None = None):
        super().__init__()
        self.head, self.form, self.table = head, form, table

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.form == SHIPPED:
            x = self.head.columns(ids)
        elif self.form is None:
            x = self.table.rows(ids.long()) if self.table is not None else torch.ones(1, self.head.dequant.quantized_data.shape[0])
        else:
            read = FORMS[self.form]
            x = _dequantize_row(read(self.head.dequant.quantized_data, ids), read(self.head.dequant.scale, ids))
        return self.head(x * 0.5)


def convert(module: nn.Module, ids: np.ndarray, runs: list[np.ndarray]) -> dict:
    """Convert, save, load; the asset bytes, the runtime's outputs for `runs`, one call's kernels."""
    import coreai_torch
    from coreai.runtime import AIModel, NDArray
    from coreai_torch import TorchConverter

    ep = torch.export.export(module.eval(), (torch.from_numpy(ids),)).run_decompositions(coreai_torch.get_decomp_table())
    with contextlib.redirect_stdout(io.StringIO()):
        program = TorchConverter(mode=TorchConverter.Mode.RELEASE).add_exported_program(
            ep, input_names=["x"], output_names=["y"], state_names=[]).to_coreai()  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        asset = program.save_asset(Path(tmp) / "m.aimodel")
        nbytes = sum(f.stat().st_size for f in (Path(tmp) / "m.aimodel").rglob("*") if f.is_file())
        lowered = Path(tmp) / "m.aimodelx"
        lowered.mkdir()
        asset._write_odix(lowered)
        loop = asyncio.new_event_loop()
        model = loop.run_until_complete(AIModel.load(lowered))
        log = OpLog()
        fn = model.load_function("main", profiler=log.profiler())
        outs = [loop.run_until_complete(fn(inputs={"x": NDArray(r)}, state={}))["y"].numpy().copy() for r in runs]
        del fn, model
        loop.close()
    return {"asset_bytes": nbytes, "outputs": outs, "kernels": summarize(log.calls[-1])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    torch.manual_seed(0)
    table = torch.randn(a.vocab, a.width) * 0.05
    b = quantize_blockwise(table.t(), 8)  # the head's own quantization of the tied weight [C, V]
    head = Int8Matmul(b.q, b.scale)
    own_table = QuantizedTable(b.q.t().contiguous(), b.scale.t().contiguous(), 8)
    ids = np.array([7], dtype=np.int32)
    runs = [np.array([i], dtype=np.int32) for i in (0, 7, a.vocab // 2 + 3, a.vocab - 1)]
    cases = {"head only (no lookup)": TiedInt8(head, None), "own int8 table (unshared)": TiedInt8(head, None, own_table)}
    cases |= {f"shared: {name}": TiedInt8(head, name) for name in (*FORMS, SHIPPED)}
    rows = []
    for label, module in cases.items():
        with torch.no_grad():
            want = [module(torch.from_numpy(r)).numpy() for r in runs]
        try:
            got = convert(module, ids, runs)
        except Exception as e:  # a refused form is a result
            rows.append({"case": label, "refused": str(e).splitlines()[0][:200]})
            print(json.dumps(rows[-1]))
            continue
        scale = max(float(np.abs(w).max()) for w in want)
        err = max(float(np.abs(g - w).max()) for g, w in zip(got["outputs"], want)) / scale
        rows.append({"case": label, "asset_bytes": got["asset_bytes"], "max_err_over_scale": err,
                     "kernels": got["kernels"].ops, "by_type": got["kernels"].by_type})  # fmt: skip
        print(json.dumps(rows[-1]))
    print(f"int8 table: {a.vocab * a.width} bytes of levels + {a.vocab * a.width // 16} of scales")
    if a.json:
        a.json.write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
