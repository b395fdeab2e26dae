"""The export stage: a loaded model in, a gated bundle out.

    options.py   ExportOptions: every option of `ssmport.export` / `ssmport export`, checked once
    pipeline.py  export(): load -> convert -> write asset, tokenizer, manifest -> gate -> rename
    convert.py   the modules built under a recipe, the layout's functions over them, torch.export
                 and the releasing TorchConverter, the signatures read back and checked
    contract.py  the decode contract, read from the converted IR
    asset.py     the asset written in steps (program released before its bytecode is hashed)

(A package named `export` would replace the `ssmport.export()` function on first import of a
submodule: importing `ssmport.export.pipeline` sets the attribute `ssmport.export`.)
Nothing is imported here.
"""
