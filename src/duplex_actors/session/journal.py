"""A resumable session's output journal: the wire messages sent, kept until the client acks them.

Each message the session sends after ``session.created`` gets the next sequence number (1, 2,
...; for the Realtime dialect with ``?duplex=1`` it is the message's ``server_event_seq``, for
the native dialect its ordinal, binary audio messages included). A resumed connection gets the
messages after the client's cursor again, byte for byte. ``session.event_ack`` trims what the
client has; the journal's bytes are bounded, and what is over the bound is evicted oldest first,
acknowledged or not: a client whose cursor was evicted gets ``session.resync_required``.
"""

from __future__ import annotations

from collections import deque
from typing import Final

WireMessage = str | bytes
DEFAULT_JOURNAL_BYTES: Final = 2 * 1024 * 1024


class CursorAhead(ValueError):
    """A cursor or ack past the last message sent."""


class Journal:
    def __init__(self, max_bytes: int = DEFAULT_JOURNAL_BYTES) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.max_bytes = max_bytes
        self.head = 0  # the last sequence number given
        self.bytes = 0  # of the messages kept
        self.evictions = 0  # messages evicted before they were acknowledged
        self.acked = 0  # the highest sequence number the client acknowledged
        self._messages: deque[WireMessage] = deque()  # head - len + 1 .. head

    @property
    def oldest(self) -> int:
        """The sequence number of the oldest message kept (head + 1 when none is)."""
        return self.head - len(self._messages) + 1

    def __len__(self) -> int:
        return len(self._messages)

    def append(self, message: WireMessage) -> int:
        """Keep ``message`` and return its sequence number; evict the oldest beyond the bound
        (the newest is always kept)."""
        self.head += 1
        self._messages.append(message)
        self.bytes += len(message)
        while self.bytes > self.max_bytes and len(self._messages) > 1:
            self.bytes -= len(self._messages.popleft())
            if self.oldest - 1 > self.acked:
                self.evictions += 1
        return self.head

    def ack(self, seq: int) -> None:
        """The client has everything up to ``seq``: those messages are dropped."""
        if seq > self.head:
            raise CursorAhead(f"server_event_seq {seq} is past the last one sent ({self.head})")
        self.acked = max(self.acked, seq)
        while self._messages and self.oldest <= seq:
            self.bytes -= len(self._messages.popleft())

    def covers(self, cursor: int) -> bool:
        """Whether every message after ``cursor`` is still kept (raises past the head)."""
        if cursor > self.head or cursor < 0:
            raise CursorAhead(f"cursor {cursor} is not in 0..{self.head}")
        return cursor >= self.oldest - 1

    def after(self, cursor: int, limit: int | None = None) -> list[WireMessage]:
        """The messages after ``cursor`` (at most ``limit``), from the oldest kept when the
        cursor is older than that."""
        start = max(cursor + 1, self.oldest)
        skip = start - self.oldest
        stop = len(self._messages) if limit is None else min(len(self._messages), skip + limit)
        if skip >= stop:
            return []
        messages = self._messages
        if skip == 0 and stop == len(messages):
            return list(messages)
        return [messages[i] for i in range(skip, stop)]


__all__ = ["DEFAULT_JOURNAL_BYTES", "CursorAhead", "Journal"]
