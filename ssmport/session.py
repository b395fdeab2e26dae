"""Moved: snapshots, the snapshot cache and chat are ssmport.runtime.{snapshot, snapshot_cache, chat}."""

import warnings

from ssmport.runtime.chat import CHAT_TEMPLATES, RWKV_WORLD_CHAT, ChatSession, ChatTemplate, TurnStats, chat_template
from ssmport.runtime.snapshot import StateSnapshot
from ssmport.runtime.snapshot_cache import SnapshotCache

warnings.warn("ssmport.session moved to ssmport.runtime.chat / .snapshot / .snapshot_cache", DeprecationWarning, stacklevel=2)

__all__ = ["CHAT_TEMPLATES", "RWKV_WORLD_CHAT", "ChatSession", "ChatTemplate", "SnapshotCache", "StateSnapshot",
           "TurnStats", "chat_template"]  # fmt: skip
