"""The wire protocol, sans-io: client messages in, typed events out; session events in, server
messages out (``docs/api.md``, ``docs/protocol.md``). No trio, no torch, no model.

- :mod:`.errors`: :class:`ProtocolError` (the codes are in :mod:`duplex_actors.error_codes`).
- :mod:`.wire_events`: attrs classes of every client and server event of both dialects.
- :mod:`.converter`: the cattrs converter between those classes and JSON objects.
- :mod:`.parsing`: client messages parsed and validated at the edge.
- :mod:`.audio_formats`, :mod:`.session_config`, :mod:`.conversation_items`: the audio an
  append carries, a session's config, the conversation items a client creates.
- :mod:`.realtime` / :mod:`.native`: projections of session events onto each dialect.
- :mod:`.schemas`: JSON Schemas generated from the classes, and traffic validators
  (not imported here: ``python -m duplex_actors.protocol.schemas`` runs it as a script).
"""

from ..error_codes import error_type
from .audio_formats import decode_append, decode_audio_b64, resolve_input_format
from .converter import dumps, encode_client_event
from .errors import ProtocolError
from .native import NativeProjection
from .parsing import parse_client_binary, parse_client_object, parse_client_text
from .realtime import RealtimeProjection, refusal_error
from .session_config import normalize_session_config

__all__ = [
    "NativeProjection",
    "ProtocolError",
    "RealtimeProjection",
    "decode_append",
    "decode_audio_b64",
    "dumps",
    "encode_client_event",
    "error_type",
    "normalize_session_config",
    "parse_client_binary",
    "parse_client_object",
    "parse_client_text",
    "refusal_error",
    "resolve_input_format",
]
