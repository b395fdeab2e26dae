"""A bounded LRU of state snapshots, keyed by their token lists."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from ssmport.errors import SsmportError
from ssmport.runtime.snapshot import StateSnapshot


class SnapshotCache:
    """Snapshots keyed by their token lists, least recently used first out, bounded by a
    count and a byte budget."""

    def __init__(self, max_count: int = 16, max_bytes: int = 256 << 20):
        if max_count < 1 or max_bytes < 1:
            raise SsmportError("the snapshot cache needs room for at least one snapshot")
        self.max_count, self.max_bytes = max_count, max_bytes
        self._items: OrderedDict[tuple[int, ...], StateSnapshot] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self._items.values())

    def put(self, snap: StateSnapshot) -> None:
        if snap.nbytes > self.max_bytes:
            return
        self._items[snap.tokens] = snap
        self._items.move_to_end(snap.tokens)
        while len(self._items) > self.max_count or self.nbytes > self.max_bytes:
            self._items.popitem(last=False)

    def longest_proper_prefix(self, tokens: Sequence[int]) -> StateSnapshot | None:
        """The snapshot with the most tokens that are a proper prefix of `tokens`."""
        best = None
        for key, snap in self._items.items():
            if len(key) < len(tokens) and (best is None or len(key) > len(best.tokens)) and is_prefix(key, tokens):
                best = snap
        if best is not None:
            self._items.move_to_end(best.tokens)
        return best


def is_prefix(prefix: Sequence[int], tokens: Sequence[int]) -> bool:
    return len(prefix) <= len(tokens) and tuple(tokens[: len(prefix)]) == tuple(prefix)
