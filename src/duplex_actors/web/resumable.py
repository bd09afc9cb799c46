"""A resumable session: what outlives its WebSocket connection (docs/protocol.md §10).

A session opened with resume on gets a :class:`ResumableSession`: a pump task (in the server's
nursery, not the connection's) projects the session's events onto the dialect and keeps every
wire message in the output journal (``session/journal.py``); the connection attached to it
streams the journal from its cursor. When the connection drops, the session stays open,
detached, for the grace period: it keeps its slot, model context, log and journal. A new
connection that presents the session's token takes it over (:meth:`ResumableSession.claim`):
the old attachment, if it is still half-open, is cancelled, a ``resume`` record is logged,
and the new connection gets ``session.resumed``, then the journal after the client's cursor,
then live output. No client input arrives while detached, so a lockstep session does not
advance: the conversation goes on where it stopped.

The token (``session/resume_token.py``) travels only in ``session.created`` and
``session.resumed``, sent to the client directly and never journaled, logged or counted.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .. import close_reasons as reasons
from .. import error_codes
from ..audio import FRAME_MS
from ..counters import Counters
from ..log import records as r
from ..protocol import wire_events as pe
from ..server import DuplexServer, SessionHandle
from ..session import events as ev
from ..session.journal import Journal, WireMessage
from ..session.resume_token import ResumeCredential
from .wire_text import wire_message

if TYPE_CHECKING:
    from .dialects import Projection

log = logging.getLogger(__name__)

# Detach reasons (the ``detach`` record's).
DROPPED = "dropped"
READ_TIMEOUT = "read_timeout"
REPLACED = "replaced"


@attrs.frozen(slots=True)
class ResumeSettings:
    """``grace_s`` 0 turns resume off (``supports_session_resume`` is then false)."""

    grace_s: float = 30.0
    journal_bytes: int = 2 * 1024 * 1024
    max_backlog_s: float = 2.0

    @property
    def enabled(self) -> bool:
        return self.grace_s > 0


class ResumeRefused(Exception):
    """A resume that cannot be granted: ``code`` and the WebSocket close code."""

    def __init__(self, code: str, message: str, close_code: int) -> None:
        super().__init__(message)
        self.code = code
        self.close_code = close_code


class ResyncRequired(Exception):
    """The client's cursor was evicted from the journal: it resumes with ``accept_gap`` or not at all."""

    def __init__(self, oldest: int) -> None:
        super().__init__(f"the journal starts at {oldest}")
        self.oldest = oldest


@attrs.frozen(slots=True)
class Claim:
    """A granted resume: the new attachment's generation, its token, where its replay starts."""

    generation: int
    token: str
    cursor: int
    replay_from: int


class ResumableSession:
    def __init__(
        self,
        server: DuplexServer[Any],
        handle: SessionHandle,
        projection: Projection,
        *,
        key_fingerprint: bytes,
        settings: ResumeSettings,
        counters: Counters,
        dialect: str,
    ) -> None:
        self.server = server
        self.handle = handle
        self.projection = projection
        self.settings = settings
        self.counters = counters
        self.dialect = dialect
        self.journal = Journal(settings.journal_bytes)
        self.credential = ResumeCredential(key_fingerprint)
        self.generation = 1  # of the attachment that holds the session (changed only by a claim)
        self.attached = True
        self.claiming = False
        self.created: dict[str, Any] | None = None  # session.created, before the token is added
        self.finished = False  # session.closed is in the journal
        self.sent = 0  # the last sequence number the attached connection has sent
        self.detached_at: float | None = None
        self.replace_attachment: Callable[[], None] | None = None  # cancels the attached connection
        self.attachment_ended = trio.Event()
        self._grew = trio.Event()
        self._claimed = trio.Event()
        self._token_proven = True
        self._counted_bytes = 0  # of the journal, in counters.journal_bytes

    @property
    def session_id(self) -> str:
        return self.handle.session_id

    # -- output ------------------------------------------------------------------------------------
    async def pump(self) -> None:
        """Project the session's events into the journal until the session closes."""
        events = self.handle.events()
        try:
            async for event in events:
                messages = self.projection.project(event)
                if isinstance(event, ev.SessionCreated) and self.created is None and messages:
                    first = messages[0]
                    assert not isinstance(first, bytes)
                    self.created = dict(first)
                    messages = messages[1:]
                for message in messages:
                    self.journal.append(wire_message(message))
                self._wake()
                if self.attached and self.journal.head - self.sent > self.server.outbox_size:
                    log.warning("session %s: consumer too slow, closing", self.session_id)
                    self.server.start_soon(self.handle.close, reasons.SLOW_CONSUMER)
                if isinstance(event, ev.SessionClosed):
                    break
        finally:
            self.finished = True
            self._wake()
            self._claimed.set()  # a grace timer has nothing left to wait for
            if self.server.resumable.get(self.session_id) is self:
                del self.server.resumable[self.session_id]
                self.server.resume_tombstones.add(self.session_id, trio.current_time())
            self.counters.journal_bytes -= self._counted_bytes
            self._counted_bytes = 0

    def _wake(self) -> None:
        change = self.journal.bytes - self._counted_bytes
        self.counters.journal_bytes += change
        self._counted_bytes = self.journal.bytes
        self._grew.set()
        self._grew = trio.Event()

    def add_closing(self, message: WireMessage) -> None:
        """A drain's ``session.closing``, journaled in order with the session's own messages."""
        if not self.finished:
            self.journal.append(message)
            self._wake()

    async def next_messages(self, cursor: int, limit: int) -> list[WireMessage]:
        """The messages after ``cursor`` (at most ``limit``), waiting for one; [] once the
        session has ended and everything was given."""
        while True:
            batch = self.journal.after(cursor, limit)
            if batch or self.finished:
                return batch
            await self._grew.wait()

    def created_message(self, token: str) -> dict[str, Any]:
        """``session.created`` for the first attachment, with the token (never journaled)."""
        assert self.created is not None
        return {
            **self.created,
            "resume_token": token,
            "attachment_generation": 1,
            "resume_grace_s": self.settings.grace_s,
        }

    async def wait_created(self) -> None:
        while self.created is None and not self.finished:
            await self._grew.wait()

    def ack(self, seq: int) -> None:
        """``session.event_ack``: trims the journal (raises ``CursorAhead``) and proves the token."""
        self.journal.ack(seq)
        self._wake()
        self.prove()

    def prove(self) -> None:
        """The client has the latest token (it acked or beat on the new attachment)."""
        if not self._token_proven:
            self._token_proven = True
            self.credential.proven()

    # -- attachments ---------------------------------------------------------------------------------
    async def detach(self, generation: int, reason: str) -> None:
        """Attachment ``generation`` ended without closing the session: log it, and unless a
        newer attachment took over, wait for one within the grace (then close ``disconnect``)."""
        if self.handle.closed:
            self.attachment_ended.set()
            return
        if generation != self.generation:
            reason = REPLACED  # a resume claimed the session while this attachment ended
        self.attached = False
        self.detached_at = trio.current_time()
        self.counters.sessions_detached += 1
        self.counters.detaches[reason] += 1
        self._claimed = trio.Event()
        try:
            await self.handle.log_record(r.Detach(generation, reason))
        except trio.ClosedResourceError:
            return
        finally:
            self.attachment_ended.set()
        if reason != REPLACED:
            self.server.start_soon(self._grace, generation)

    async def _grace(self, generation: int) -> None:
        claimed = self._claimed
        with trio.move_on_after(self.settings.grace_s):
            await claimed.wait()
        if not claimed.is_set() and self.generation == generation and not self.attached:
            self.counters.resumes["expired"] += 1
            self._detached_done()
            await self.handle.close(reasons.DISCONNECT)

    def _detached_done(self) -> None:
        if self.detached_at is not None:
            self.counters.detached_slot_s += trio.current_time() - self.detached_at
            self.counters.sessions_detached -= 1
            self.detached_at = None

    def check(self, request: pe.SessionResume, key_fingerprint: bytes) -> None:
        """Raise what refuses ``request`` now (:class:`ResumeRefused`, :class:`ResyncRequired`)."""
        if self.handle.closed or self.finished:
            raise ResumeRefused(error_codes.SESSION_RESUME_EXPIRED, "the session has ended", 1000)
        if not self.credential.matches(request.resume_token, key_fingerprint):
            raise ResumeRefused(
                error_codes.INVALID_RESUME_TOKEN, "the resume token is not valid for this session", 1008
            )
        if self.claiming:
            raise ResumeRefused(
                error_codes.SESSION_RESUME_CONFLICT, "another connection is resuming this session", 1008
            )
        cursor = request.last_received_server_event_seq
        if cursor < 0 or cursor > self.journal.head:
            raise ResumeRefused(
                error_codes.INVALID_SESSION_RESUME,
                f"last_received_server_event_seq {cursor} is not in 0..{self.journal.head}",
                1008,
            )
        if not self.journal.covers(cursor) and not request.accept_gap:
            raise ResyncRequired(self.journal.oldest)

    def claim(self, request: pe.SessionResume, key_fingerprint: bytes) -> Claim:
        """Check and take the session over, with no checkpoint between: of concurrent resumes
        exactly one wins (the others get ``session_resume_conflict``). The caller then runs
        :meth:`take_over` and, if that fails, :meth:`abandon`."""
        self.check(request, key_fingerprint)
        self.claiming = True
        self.generation += 1
        self._token_proven = False
        token = self.credential.consume(request.resume_token)
        cursor = request.last_received_server_event_seq
        return Claim(self.generation, token, cursor, max(cursor + 1, self.journal.oldest))

    async def take_over(self, claim: Claim) -> r.Resume:
        """End the old attachment (a half-open socket is cancelled), log ``resume`` durably,
        and attach the claimant. Returns the record (what ``session.resumed`` says)."""
        if self.attached and self.replace_attachment is not None:
            self.counters.takeovers += 1
            self.replace_attachment()
            await self.attachment_ended.wait()
        self.attachment_ended = trio.Event()
        await self.handle.wait_handled()
        core = self.handle.core
        record = r.Resume(
            attachment=claim.generation,
            cursor=claim.cursor,
            replay_from=claim.replay_from,
            last_server_event_seq=self.journal.head,
            input_samples_received=core.client_samples,
            last_client_event_id=self.handle.last_client_event_id,
        )
        await self.handle.log_record(record)
        self.handle.protect_backlog(math.ceil(self.settings.max_backlog_s * 1000 / FRAME_MS))
        self._detached_done()
        self.attached = True
        self.sent = claim.replay_from - 1
        self.claiming = False
        self._claimed.set()
        self.counters.resumes["resumed"] += 1
        return record

    def abandon(self) -> None:
        """A claim that did not finish (its connection dropped during the take-over): the
        session stays detached; the token it was given was never delivered, so the one it
        presented stays good for one retry."""
        self.claiming = False
        self._token_proven = False
        if not self.attached and not self._claimed.is_set() and not self.handle.closed:
            self.server.start_soon(self._grace, self.generation)


__all__ = [
    "Claim",
    "ResumableSession",
    "ResumeRefused",
    "ResumeSettings",
    "ResyncRequired",
]
