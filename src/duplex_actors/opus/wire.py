"""The codec workers' pipe protocol: length-prefixed binary frames, little-endian.

Requests (server -> worker, on the worker's stdin)::

    u32 request id | u32 stream id | u8 op | u32 payload length | payload

Responses (worker -> server, on the worker's stdout), one per request except ``CLOSE``, in
request order::

    u32 request id | u8 status | f64 CPU seconds of the op | u32 payload length | payload

Payloads: ``DECODE`` / ``DISCARD`` carry Ogg bytes; ``ENCODE`` carries float32 samples. An OK
response to ``DECODE`` or ``ENCODE`` carries float32 samples or Ogg pages; an error response
carries a UTF-8 message. The worker's first frame is a response with request id 0 (ready).
Streams are created by their first op and freed by ``CLOSE``.
"""

from __future__ import annotations

import struct
from typing import Final

REQUEST: Final = struct.Struct("<IIBI")
RESPONSE: Final = struct.Struct("<IBdI")

DECODE: Final = 1
DISCARD: Final = 2
ENCODE: Final = 3
CLOSE: Final = 4
OP_NAMES: Final = {DECODE: "decode", DISCARD: "discard", ENCODE: "encode", CLOSE: "close"}

OK: Final = 0
UNDECODABLE: Final = 1
FAILED: Final = 2

READY_ID: Final = 0


def request(request_id: int, stream_id: int, op: int, payload: bytes) -> bytes:
    return REQUEST.pack(request_id, stream_id, op, len(payload)) + payload


def response(request_id: int, status: int, cpu_s: float, payload: bytes) -> bytes:
    return RESPONSE.pack(request_id, status, cpu_s, len(payload)) + payload
