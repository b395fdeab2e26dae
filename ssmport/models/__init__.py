"""The built-in architectures, one package each, written against the public API exactly as a
plugin would be (docs/adding-an-architecture.md):

    config.py       the config dataclass, its presets, reading and refusing config.json keys
    checkpoints.py  canonical tensor names and shapes, the checkpoint layouts, the strict check
    reference.py    the plain fp32 loop, written for reading: the spec
    block.py        the export-form layer(s) over ssmport.ops, for ssmport.graph.CausalLM
    quant.py        each weight's role, and which roles stay float under int8keepproj
    synthetic.py    deterministic random weights with sane scales
    __init__.py     the Architecture object that ties them together
"""
