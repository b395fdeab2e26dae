"""Running bundles on `coreai.runtime`: the lowering cache, the Runner, state snapshots
(I/O and a bounded cache) and the multi-turn chat engine, one module each."""

from ssmport.runtime.lowering import (
    STAMP, asset_sha256, cache_root, ensure_lowered, forget_lowering, lowered_path, lowering_key, uses_os_runtime,
)  # fmt: skip
from ssmport.runtime.runner import Runner
from ssmport.runtime.snapshot import StateSnapshot

__all__ = [
    "STAMP", "Runner", "StateSnapshot", "asset_sha256", "cache_root", "ensure_lowered", "forget_lowering",
    "lowered_path", "lowering_key", "uses_os_runtime",
]  # fmt: skip
