"""The load stage: what the user typed -> a LoadedModel.

    resolve.py     the spec (preset, BlinkDL .pth, HF / fla folder, org/repo[@rev]) -> LoadedModel:
                   presets, paths, Hub repos, vocab lookup, --context
    checkpoint.py  lazy tensor sources (.pth mmapped, safetensors, sharded or not), strict checks
    hub.py         Hugging Face Hub downloads: which files, disk check, sha256 check, provenance
    pretrained/    models whose trained weights ship in the package (data; scoring a bundle of
                   one is ssmport.gate.checks's)

(`ssmport.load()` is a function of the package; a subpackage named `load` would replace it.)
Nothing is imported here.
"""
