"""ssmport's version (pyproject.toml's), in a module of its own: the exporter records it in every
manifest without importing the package's facade (ssmport/__init__.py, which imports the exporter)."""

__version__ = "0.1.0"
