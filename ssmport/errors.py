"""User-facing errors.

Everything a user can cause (a bad path, a wrong checkpoint, a bundle that does not match)
raises `SsmportError`. The CLI prints its message as one line and exits non-zero; a
traceback always means a bug in ssmport.
"""


class SsmportError(Exception):
    """An error caused by the user's input, reported as one clear line."""


class CheckpointError(SsmportError):
    """A checkpoint that cannot be loaded strictly (missing/unexpected/misshaped keys)."""


class BundleError(SsmportError):
    """A bundle that is missing, incomplete, or inconsistent with its manifest."""
