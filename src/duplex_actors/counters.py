"""The process-wide counters that session actors and connections update; ``metrics`` renders them.

Kept apart from the rendering so that the session actor (below the scheduler) can type them.
"""

from __future__ import annotations

from collections import Counter


class Counters:
    """Process-wide counters the session actors and connections update (no locks: one loop)."""

    def __init__(self) -> None:
        self.frames_in = 0
        self.frames_out = 0
        self.dropped: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.close_codes: Counter[int] = Counter()
        self.sessions_opened = 0
        self.sessions_closed: Counter[str] = Counter()
        self.connection_errors: Counter[str] = Counter()
        self.connections_dropped: Counter[str] = Counter()  # by the transport bounds, by reason
        self.refused: Counter[str] = Counter()
        self.sessions_by_dialect: Counter[str] = Counter()
        # Client messages read and not applied (e.g. /api/chat audio before its handshake).
        self.ignored_messages: Counter[str] = Counter()
        # Alignment pads inserted into sessions' input (24 kHz samples; docs/protocol.md §7).
        self.align_pad_samples = 0
        # Resumable sessions (docs/protocol.md §10): detached now, detaches by reason, resumes by
        # outcome, takeovers of a half-open attachment, slot-seconds held while detached, and
        # the bytes their output journals keep.
        self.sessions_detached = 0
        self.detaches: Counter[str] = Counter()
        self.resumes: Counter[str] = Counter()
        self.takeovers = 0
        self.detached_slot_s = 0.0
        self.journal_bytes = 0
