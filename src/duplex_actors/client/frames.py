"""One client WebSocket frame as bytes (masked, as RFC 6455 requires of clients), for the
byte-level clients: ``duplex-load --lean`` (``client/lean_wire.py``), the reliability tests and
``bench/append_path.py``."""

from __future__ import annotations

import struct

import numpy as np

DEFAULT_MASK = b"\x01\x02\x03\x04"


def client_frame(
    opcode: int, payload: bytes, *, fin: bool = True, rsv1: bool = False, mask: bytes = DEFAULT_MASK
) -> bytes:
    """The frame of ``payload`` (``opcode`` 1 text, 2 binary, 8 close, ...), masked with ``mask``."""
    head = bytes([(0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack(">H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack(">Q", n)
    if not payload:
        return head + mask
    data = np.frombuffer(payload, dtype=np.uint8)
    key = np.resize(np.frombuffer(mask, dtype=np.uint8), n)
    return head + mask + (data ^ key).tobytes()


__all__ = ["DEFAULT_MASK", "client_frame"]
