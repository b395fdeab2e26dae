"""ssmport: recurrent / linear-attention language models to Apple Core AI bundles."""

__version__ = "0.1.0"
