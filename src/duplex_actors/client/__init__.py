"""Python client for duplex-actors servers, and the ``duplex-client`` / ``duplex-load`` tools.

Only trio, trio-websocket, numpy and the sans-io :mod:`duplex_actors.protocol` package: never
torch or the model, so it installs and runs anywhere the protocol does.

- :func:`open_duplex_client` / :class:`DuplexClient` (:mod:`.connection`): one session, typed
  events, paced or unpaced streaming, cancel/clear/update/close, typed refusals.
- :mod:`.events`: the typed server events; :mod:`.errors`: the exceptions.
- :mod:`.audio`: WAV in/out, downmix and resampling to 24 kHz, synthetic speech-like audio.
- :mod:`.cli` (``duplex-client``) and :mod:`.load` (``duplex-load``): the command-line tools.
"""

from .audio import EncodedAudio, append_message, encode_audio, to_wire_bytes
from .connection import DuplexClient, create_duplex_session_config, open_duplex_client
from .errors import (
    ConfigRefused,
    ConnectFailed,
    DuplexError,
    HandshakeRejected,
    RequestRefused,
    ResourceExhausted,
    ServerClosed,
    SessionLost,
    SessionRefused,
    Unauthorized,
)
from .events import (
    AudioDelta,
    Error,
    ErrorEvent,
    OtherEvent,
    ResponseCreated,
    ResponseDone,
    Resumed,
    ServerEvent,
    SessionClosed,
    SessionClosing,
    SessionCreated,
    SessionUpdated,
    TranscriptDelta,
    parse_server_event,
)

__all__ = [
    "AudioDelta",
    "ConfigRefused",
    "ConnectFailed",
    "DuplexClient",
    "DuplexError",
    "EncodedAudio",
    "Error",
    "ErrorEvent",
    "HandshakeRejected",
    "OtherEvent",
    "RequestRefused",
    "ResourceExhausted",
    "ResponseCreated",
    "ResponseDone",
    "Resumed",
    "ServerClosed",
    "ServerEvent",
    "SessionClosed",
    "SessionClosing",
    "SessionCreated",
    "SessionLost",
    "SessionRefused",
    "SessionUpdated",
    "TranscriptDelta",
    "Unauthorized",
    "append_message",
    "create_duplex_session_config",
    "encode_audio",
    "open_duplex_client",
    "parse_server_event",
    "to_wire_bytes",
]
