"""The exceptions of :mod:`duplex_actors.client`; all derive from :class:`DuplexError`.

=========================  ==================================================================
exception                  when
=========================  ==================================================================
``ConnectFailed``          no WebSocket: connection refused, DNS, timeout, bad handshake
``HandshakeRejected``      the server answered the upgrade with an HTTP error (``status``)
``Unauthorized``           ... with 401 or 403 (missing/invalid API key, origin not allowed)
``SessionRefused``         an ``error`` instead of ``session.created`` (``code``, ``message``)
``ResourceExhausted``      ... ``resource_exhausted``: every slot is taken (close 1013)
``ConfigRefused``          the session opened but the config it was asked for was refused
``ServerClosed``           the socket closed before ``session.closed`` (``code``, ``reason``),
                           or a command was sent after the connection had closed
``RequestRefused``         a command the client waits on (``update``) was answered by ``error``
=========================  ==================================================================
"""

from __future__ import annotations


class DuplexError(Exception):
    """Base class of every client error."""


class ConnectFailed(DuplexError):
    """The WebSocket could not be opened."""


class HandshakeRejected(ConnectFailed):
    """The server refused the WebSocket upgrade with an HTTP error."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.code = code


class Unauthorized(HandshakeRejected):
    """HTTP 401 / 403 before the upgrade: the API key or the Origin was refused."""


class SessionRefused(DuplexError):
    """The server sent ``error`` instead of opening the session."""

    def __init__(self, code: str, message: str, close_code: int | None = None) -> None:
        super().__init__(f"{code}: {message}" + (f" (close {close_code})" if close_code else ""))
        self.code = code
        self.message = message
        self.close_code = close_code


class ResourceExhausted(SessionRefused):
    """Every session slot is taken (``resource_exhausted``, then close 1013): try again later."""


class ConfigRefused(SessionRefused):
    """The session opened, but the config it was opened with was refused (``invalid_voice``, ...)."""


class ServerClosed(DuplexError):
    """The connection closed without (or before) ``session.closed``."""

    def __init__(self, code: int | None, reason: str | None) -> None:
        super().__init__(f"connection closed (code {code}, reason {reason!r})")
        self.code = code
        self.reason = reason


class RequestRefused(DuplexError):
    """The server answered a command with ``error``."""

    def __init__(self, code: str, message: str, event_id: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.event_id = event_id


class SessionLost(ServerClosed):
    """The connection of a resumable session dropped and the session could not be resumed.
    ``cause``: the server's refusal (``session_resume_expired``: the session is gone;
    ``session_not_found``: the server restarted; ``invalid_resume_token``, ...), ``journal_gap``
    (the server no longer holds every event the client missed; see ``accept_gap``),
    ``input_gap`` (the client no longer holds every input sample the server lacks; see
    ``resume_input_s``) or ``grace_expired`` (no resume succeeded within the server's
    ``resume_grace_s``). ``code``/``reason``: the close of the connection that dropped."""

    def __init__(self, cause: str, message: str, code: int | None = None, reason: str | None = None) -> None:
        super().__init__(code, reason)
        self.args = (f"session lost ({cause}): {message}",)
        self.cause = cause
        self.message = message
