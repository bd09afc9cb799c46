"""A connection's budget of messages and bytes per second (sans-io: no trio, no clock).

Two token buckets, refilled relative to real time, with a burst allowance each, so that no
client can spend other sessions' time (docs/design.md, decision 11). The defaults admit what
real clients do: a browser sending 10 ms chunks (100 appends/s), vLLM-Omni's ``DuplexClient``
acknowledging every event (~25/s), and a 30 s upload at session start (held back a little,
never closed). Beyond its budget, the shell stops reading the client's socket until the buckets
refill (TCP pushes back), and closes a client that stays beyond it for ``persist_s`` with
``rate_limited``. The shell passes the time in: nothing here reads a clock.
"""

from __future__ import annotations

import attrs


@attrs.frozen(slots=True)
class RateLimits:
    """``messages_per_s``/``message_burst``: client messages of any kind; ``bytes_per_s``/
    ``byte_burst``: their wire size (text or binary). ``persist_s``: how long a client may stay
    held back (every message having to wait) before it is closed with ``rate_limited``."""

    messages_per_s: float = 200.0
    message_burst: float = 250.0
    bytes_per_s: float = 1024.0 * 1024.0
    byte_burst: float = 8.0 * 1024.0 * 1024.0
    persist_s: float = 60.0
    # Messages that are not audio (session.update, acks, heartbeats, refused ones) also pay
    # their bytes from a smaller bucket: the byte burst is sized for a 30 s upload, and a burst
    # of large session.updates (each parsed, checked and answered on the event loop) would cost
    # the other sessions their latency. This burst takes four updates of the largest config the
    # core accepts (256 KiB); real clients send a few small ones.
    control_bytes_per_s: float = 128.0 * 1024.0
    control_byte_burst: float = 1024.0 * 1024.0

    def __attrs_post_init__(self) -> None:
        for name in (
            "messages_per_s",
            "message_burst",
            "bytes_per_s",
            "byte_burst",
            "persist_s",
            "control_bytes_per_s",
            "control_byte_burst",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if self.message_burst < 1:
            raise ValueError("message_burst must admit one message")


@attrs.define(slots=True)
class TokenBucket:
    """``capacity`` tokens, refilled at ``rate`` per second. A cost larger than the capacity is
    admitted once the bucket is full and leaves it in debt, so no single message is refused
    here (message sizes are the transport's limit) but a large one is paid for."""

    rate: float
    capacity: float
    tokens: float
    stamp: float

    @classmethod
    def full(cls, rate: float, capacity: float, now: float) -> TokenBucket:
        return cls(rate, capacity, capacity, now)

    def refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now

    def wait(self, cost: float) -> float:
        """Seconds until ``cost`` can be taken (0: now), after :meth:`refill`."""
        need = min(cost, self.capacity)
        short = need - self.tokens
        # A rounding error's worth short is enough: waiting it out could not advance a clock.
        return 0.0 if short <= 1e-9 * max(1.0, need) else short / self.rate

    def take(self, cost: float) -> None:
        self.tokens -= cost


class InputBudget:
    """One connection's budget. ``admit(now, nbytes)`` returns 0.0 when the message may be
    handled now (its cost is taken), else the seconds to wait before asking again (nothing
    taken). ``held_since`` is when the client began to be held back continuously: set by the
    first message that had to wait, cleared by a message admitted without waiting once the
    buckets are half full again."""

    def __init__(self, limits: RateLimits, now: float) -> None:
        self.limits = limits
        self.messages = TokenBucket.full(limits.messages_per_s, limits.message_burst, now)
        self.bytes = TokenBucket.full(limits.bytes_per_s, limits.byte_burst, now)
        self.control = TokenBucket.full(limits.control_bytes_per_s, limits.control_byte_burst, now)
        self.held_since: float | None = None
        self._waiting = False  # the current message has been told to wait at least once

    def admit(self, now: float, nbytes: int) -> float:
        return self._admit(now, ((self.messages, 1.0), (self.bytes, float(nbytes))))

    def admits_now(self, now: float, nbytes: int) -> bool:
        """Whether :meth:`admit` would admit the message now (nothing taken, nothing held)."""
        for bucket, cost in ((self.messages, 1.0), (self.bytes, float(nbytes))):
            bucket.refill(now)
            if bucket.wait(cost) > 0:
                return False
        return True

    def take_admitted(self, nbytes: int) -> None:
        """:meth:`admit` of a message that :meth:`admits_now` admitted at this same time (its
        refill is done and its cost fits): the cost is taken."""
        self.messages.take(1.0)
        self.bytes.take(float(nbytes))
        self._admitted()

    def admit_control(self, now: float, nbytes: int) -> float:
        """Like :meth:`admit`, for the control bytes of a message that is not audio (asked
        once it has passed :meth:`admit` and been parsed). One message costs at most the
        control burst: a single huge message is the byte budget's to pay for (its debt there
        already holds the client back), not a debt of minutes here."""
        cost = min(float(nbytes), self.limits.control_byte_burst)
        return self._admit(now, ((self.control, cost),))

    def _admit(self, now: float, costs: tuple[tuple[TokenBucket, float], ...]) -> float:
        delay = 0.0
        for bucket, cost in costs:
            bucket.refill(now)
            delay = max(delay, bucket.wait(cost))
        if delay > 0:
            if not self._waiting and self.held_since is None:
                self.held_since = now
            self._waiting = True
            return delay
        for bucket, cost in costs:
            bucket.take(cost)
        self._admitted()
        return 0.0

    def _admitted(self) -> None:
        # Held back ends only once the buckets have refilled well (half full): a client kept
        # at the rate passes a few messages without waiting whenever the shell's sleep
        # overshoots, and must not be forgiven for that.
        if not self._waiting and self.held_since is not None and self._recovered():
            self.held_since = None
        self._waiting = False

    def _recovered(self) -> bool:
        return all(b.tokens >= b.capacity / 2 for b in (self.messages, self.bytes, self.control))

    def persistent(self, now: float, since: float | None = None) -> bool:
        """Whether the client has been held back for longer than ``persist_s``: by this budget,
        or since ``since`` by something else (the session's input backlog), whichever is older."""
        if self.held_since is None and since is None:
            return False
        starts = [t for t in (self.held_since, since) if t is not None]
        return bool(starts) and now - min(starts) > self.limits.persist_s
