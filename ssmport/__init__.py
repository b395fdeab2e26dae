"""ssmport: recurrent / linear-attention language models to Apple Core AI decode bundles.

Library use::

    import ssmport
    result = ssmport.export("rwkv7-tiny", out="out/")        # -> ExportResult(path, manifest, ...)
    with ssmport.load(result.path) as runner:                 # no-KV runner on coreai.runtime
        logits = runner.step(1)

New architectures plug in with `ssmport.register_architecture(...)`, from any file or module
(on the command line: `ssmport --plugin FILE`); `ssmport.testing.check_architecture` checks the
contract every architecture must meet. See docs/adding-an-architecture.md.
Heavy modules (torch, coreai) are imported on first use, so `import ssmport.tokenizers`
stays light.
"""

from ssmport._quiet import silence_version_warning
from ssmport.errors import BundleError, CheckpointError, SsmportError
from ssmport.version import __version__

silence_version_warning()  # coreai-torch misreads torch "2.13.0+cpu" as newer than 2.13.0

_FROM_ARCHITECTURES = (
    "Architecture", "LoadedModel", "Preset", "architectures", "get_architecture", "presets", "register_architecture",
)  # fmt: skip


def __getattr__(name: str):
    if name in _FROM_ARCHITECTURES:
        import ssmport.architectures as architectures_module

        return getattr(architectures_module, name)
    raise AttributeError(f"module 'ssmport' has no attribute {name!r}")


def export(spec, out="out", **kwargs):
    """Export a preset, checkpoint path or LoadedModel to a bundle; see `ssmport.exporter.pipeline.export`."""
    from ssmport.exporter.pipeline import export as _export

    return _export(spec, out, **kwargs)


def load(bundle):
    """A `Runner` for a bundle (use as a context manager, or call `.close()`)."""
    from ssmport.runtime import Runner

    return Runner(bundle)


def load_model(spec, weights=None, synthetic=False, seed=0, vocab=None):
    """Resolve a preset or checkpoint to a `LoadedModel` (config + canonical weights)."""
    from ssmport.loader.resolve import load_model as _load_model

    return _load_model(spec, weights=weights, synthetic=synthetic, seed=seed, vocab=vocab)


__all__ = [
    "Architecture",
    "BundleError",
    "CheckpointError",
    "LoadedModel",
    "Preset",
    "SsmportError",
    "__version__",
    "architectures",
    "export",
    "get_architecture",
    "load",
    "load_model",
    "presets",
    "register_architecture",
]
