"""Why a session ended: the ``reason`` of its ``Close`` record and ``SessionClosed`` event.

``web.connection.CLOSE_CODES`` maps each to the WebSocket close code the client sees.
"""

from __future__ import annotations

from typing import Final

CLIENT_CLOSE: Final = "client_close"  # the client asked (``session.close``, a client close frame)
TIMEOUT: Final = "timeout"  # nothing arrived within the idle timeout
DISCONNECT: Final = "disconnect"  # the client's socket dropped
SERVER_SHUTDOWN: Final = "server_shutdown"  # the server drains
ERROR: Final = "error"  # the server failed on this session
LOG_UNAVAILABLE: Final = "log_unavailable"  # the session log cannot be written
SLOW_CONSUMER: Final = "slow_consumer"  # the client did not read its events in time
RATE_LIMITED: Final = "rate_limited"  # the client stayed beyond its input budget
# /api/chat's own endings: undecodable Ogg/Opus, and a codec worker process that died
INVALID_AUDIO: Final = "invalid_audio"
CODEC_LOST: Final = "codec_lost"
