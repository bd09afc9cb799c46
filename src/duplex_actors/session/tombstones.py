"""The ids of resumable sessions that ended lately, so that a late resume is told
``session_resume_expired`` rather than ``session_not_found`` (docs/protocol.md §10)."""

from __future__ import annotations

from collections import OrderedDict


class Tombstones:
    """At most ``size`` ids, each for ``ttl_s`` seconds of the caller's clock."""

    def __init__(self, size: int = 10_000, ttl_s: float = 900.0) -> None:
        self.size, self.ttl_s = size, ttl_s
        self._ended: OrderedDict[str, float] = OrderedDict()

    def add(self, session_id: str, now: float) -> None:
        self._ended[session_id] = now
        self._ended.move_to_end(session_id)
        while len(self._ended) > self.size:
            self._ended.popitem(last=False)

    def holds(self, session_id: str, now: float) -> bool:
        ended = self._ended.get(session_id)
        return ended is not None and now - ended <= self.ttl_s


__all__ = ["Tombstones"]
