"""The common case of WebSocket traffic, framed and parsed without wsproto's general machinery (sans-io).

A client streaming audio sends whole, unfragmented, masked text or binary frames; a read from
the socket holds one or a few of them. :func:`leading_messages` decodes the complete frames of
that kind at the start of a read and says how many bytes they took. Whatever follows (a control
frame, a fragment, a frame not yet complete, anything wsproto would refuse) is left to wsproto,
which then starts on a frame boundary: the result is what wsproto would deliver for those
bytes, message for message. :func:`server_frame` frames a message as wsproto frames it for a
server (tests/web/test_ws_frames.py holds both side by side with wsproto).

RFC 6455 section 5.2: byte 0 is FIN, three RSV bits and the opcode (0x81: a final text
frame, 0x82: a final binary one; no extension is negotiated, so RSV is 0); byte 1 is the MASK
bit and a 7-bit length, where 126 and 127 announce a 16- and a 64-bit length in the minimal
encoding; then the 4-byte masking key and the payload.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# websockets' C mask (its ``speedups`` extension, in its wheels): a tenth of the numpy path's
# cost for an 80 ms append. A websockets built without it leaves the numpy path.
_c_apply_mask: Callable[[bytes, bytes], bytes] | None
try:
    from websockets.speedups import apply_mask as _c_apply_mask
except ImportError:  # websockets built without its C extension
    _c_apply_mask = None

FINAL_TEXT = 0x81
FINAL_BINARY = 0x82
MASKED = 0x80
LENGTH_16 = 126
LENGTH_64 = 127
_WORD = np.dtype("<u4")
NUMPY_UNMASK_FROM = 2048  # shorter payloads: one XOR of two Python ints is cheaper than the arrays


def unmask(payload: bytes, key: bytes) -> bytes:
    """``payload`` XOR the repeated 4-byte ``key``."""
    if _c_apply_mask is not None:
        return _c_apply_mask(payload, key)
    return unmask_in_python(payload, key)


def unmask_in_python(payload: bytes, key: bytes) -> bytes:
    """:func:`unmask` without websockets' C extension."""
    n = len(payload)
    if n < NUMPY_UNMASK_FROM:
        keys = (key * (n // 4 + 1))[:n]
        return (int.from_bytes(payload, "little") ^ int.from_bytes(keys, "little")).to_bytes(n, "little")
    # The whole words XOR one little-endian int, in one array op (a uint32 array scalar or a
    # copy of the input first costs more than the XOR); the last 1-3 bytes, one by one.
    whole = n - n % 4
    words = (np.frombuffer(payload, dtype=_WORD, count=whole // 4) ^ int.from_bytes(key, "little")).tobytes()
    if whole == n:
        return words
    return words + bytes(b ^ k for b, k in zip(payload[whole:], key, strict=False))


def leading_messages(data: bytes, max_payload: int) -> tuple[list[str | bytes], int]:
    """The messages of the whole, final, masked text or binary frames at the start of ``data``
    (none longer than ``max_payload``; text valid UTF-8), and the bytes they took."""
    messages: list[str | bytes] = []
    pos, n = 0, len(data)
    while n - pos >= 6:
        first, second = data[pos], data[pos + 1]
        if (first != FINAL_TEXT and first != FINAL_BINARY) or not second & MASKED:
            break
        length = second & 0x7F
        head = pos + 2
        if length == LENGTH_16:
            if n - head < 2:
                break
            length = int.from_bytes(data[head : head + 2], "big")
            if length < LENGTH_16:
                break  # not minimal: wsproto refuses it
            head += 2
        elif length == LENGTH_64:
            if n - head < 8:
                break
            length = int.from_bytes(data[head : head + 8], "big")
            if length <= 0xFFFF:
                break
            head += 8
        if length > max_payload:
            break
        start = head + 4
        end = start + length
        if end > n:
            break
        payload = unmask(data[start:end], data[head:start])
        if first == FINAL_TEXT:
            try:
                messages.append(payload.decode("utf-8"))
            except UnicodeDecodeError:
                break
        else:
            messages.append(payload)
        pos = end
    return messages, pos


def server_frame(message: str | bytes) -> bytes:
    """``message`` as one final, unmasked frame (a server's): text for str, binary for bytes."""
    if isinstance(message, str):
        first, payload = FINAL_TEXT, message.encode("utf-8")
    else:
        first, payload = FINAL_BINARY, bytes(message)
    n = len(payload)
    if n < LENGTH_16:
        head = bytes((first, n))
    elif n <= 0xFFFF:
        head = bytes((first, LENGTH_16)) + n.to_bytes(2, "big")
    else:
        head = bytes((first, LENGTH_64)) + n.to_bytes(8, "big")
    return head + payload


__all__ = ["leading_messages", "server_frame", "unmask", "unmask_in_python"]
