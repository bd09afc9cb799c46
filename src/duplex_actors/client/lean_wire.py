"""The wire of ``duplex-load --lean`` (pure, no I/O): a minimal WebSocket client framing, the
upgrade handshake, the pre-encoded messages, and a cheap reading of the server's replies.

WebSocket (RFC 6455) as far as a load client needs it: client frames (``client/frames.py``) are
masked and sent whole (FIN set, no extensions, no subprotocol); server frames are unmasked, fragments are joined, and
control frames (ping, close) come out as they arrive. The masking key of a pre-encoded message is
drawn once and the same bytes go to every session (the key is there to stop cache poisoning
through proxies, which a benchmark on loopback does not meet).

Replies are only counted and timed, not parsed: a text message is an output audio delta when its
first :data:`HEAD_BYTES` bytes name one (``response.output_audio.delta``, the beta
``response.audio.delta``, native's ``response.output_audio.delta``); its ``frame_index`` and
``input_samples_end`` are then read with a regular expression in its last :data:`TAIL_BYTES`
bytes (the Realtime delta's ``metadata`` follows the base64 audio) or, failing that, its first
bytes (native's JSON delta states ``frame_index`` before the audio). Inside a JSON string a quote
is escaped, so ``"frame_index":`` cannot match inside a transcript. A native binary frame carries
both in its header (``protocol/native.py``: ``u32 frame_index [| u32 input_samples_end] | PCM16``).
Every other message (a few per session: session events, alignment hints, errors) is JSON and is
parsed as such by the caller.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import struct
from typing import Any, Final

import numpy as np

from ..audio import FRAME_PCM16_BYTES, FRAME_SAMPLES, SAMPLE_RATE
from .audio import append_message
from .frames import client_frame

OP_CONTINUATION: Final = 0x0
OP_TEXT: Final = 0x1
OP_BINARY: Final = 0x2
OP_CLOSE: Final = 0x8
OP_PING: Final = 0x9
OP_PONG: Final = 0xA

_WS_GUID: Final = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_LEN16: Final = struct.Struct("!H")
_LEN64: Final = struct.Struct("!Q")
_CLOSE_CODE: Final = struct.Struct("!H")
_FRAME_INDEX_LE: Final = struct.Struct("<I")
_FRAME_POSITION_LE: Final = struct.Struct("<II")


class WebSocketViolation(Exception):
    """The server broke the framing (a masked frame, RSV bits without an extension, a stray
    continuation)."""


# -- client frames -----------------------------------------------------------------------------
def masked_frame(opcode: int, payload: bytes) -> bytes:
    """One whole client frame (FIN set) masked with a fresh random key (``client/frames.py``)."""
    return client_frame(opcode, payload, mask=os.urandom(4))


def close_frame(code: int = 1000, reason: str = "") -> bytes:
    return masked_frame(OP_CLOSE, _CLOSE_CODE.pack(code) + reason.encode("utf-8")[:120])


def close_payload(payload: bytes) -> tuple[int | None, str]:
    """``(code, reason)`` of a close frame's payload (code None when it has none)."""
    if len(payload) < 2:
        return None, ""
    return _CLOSE_CODE.unpack_from(payload)[0], payload[2:].decode("utf-8", "replace")


# -- server frames -----------------------------------------------------------------------------
class FrameReader:
    """Whole messages from the server's byte stream: :meth:`feed` takes what a ``recv``
    returned and gives back ``(opcode, payload)`` of every message it completes, in order."""

    __slots__ = ("_frag_op", "_frags", "_rest")

    def __init__(self) -> None:
        self._rest = b""
        self._frag_op: int | None = None
        self._frags: list[bytes] = []

    @property
    def buffered(self) -> int:
        """Bytes held of a frame not yet whole."""
        return len(self._rest)

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        if self._rest:
            data = self._rest + data
        out: list[tuple[int, bytes]] = []
        pos, end = 0, len(data)
        while end - pos >= 2:
            b0, b1 = data[pos], data[pos + 1]
            n = b1 & 0x7F
            at = pos + 2
            if n == 126:
                if end - at < 2:
                    break
                n = _LEN16.unpack_from(data, at)[0]
                at += 2
            elif n == 127:
                if end - at < 8:
                    break
                n = _LEN64.unpack_from(data, at)[0]
                at += 8
            if b1 & 0x80:
                raise WebSocketViolation("a server frame is masked")
            if b0 & 0x70:
                raise WebSocketViolation("RSV bits set with no extension negotiated")
            if end - at < n:
                break
            payload = data[at : at + n]
            pos = at + n
            opcode = b0 & 0x0F
            if opcode >= OP_CLOSE:  # control frames are never fragmented
                out.append((opcode, payload))
            elif b0 & 0x80:  # FIN
                if opcode == OP_CONTINUATION:
                    if self._frag_op is None:
                        raise WebSocketViolation("a continuation frame with no message open")
                    self._frags.append(payload)
                    out.append((self._frag_op, b"".join(self._frags)))
                    self._frag_op, self._frags = None, []
                elif self._frag_op is not None:
                    raise WebSocketViolation("a new message inside a fragmented one")
                else:
                    out.append((opcode, payload))
            elif opcode == OP_CONTINUATION:
                if self._frag_op is None:
                    raise WebSocketViolation("a continuation frame with no message open")
                self._frags.append(payload)
            else:
                if self._frag_op is not None:
                    raise WebSocketViolation("a new message inside a fragmented one")
                self._frag_op, self._frags = opcode, [payload]
        self._rest = data[pos:]
        return out


# -- the upgrade -------------------------------------------------------------------------------
def handshake_request(host: str, path: str, key: str, api_key: str | None = None) -> bytes:
    """The HTTP/1.1 upgrade request (``host`` as the Host header: ``name:port``)."""
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: {host}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
    ]
    if api_key:
        lines.append(f"Authorization: Bearer {api_key}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def handshake_key() -> str:
    return base64.b64encode(os.urandom(16)).decode("ascii")


def accept_value(key: str) -> str:
    """The ``Sec-WebSocket-Accept`` a server must answer to ``key``."""
    return base64.b64encode(hashlib.sha1(key.encode("ascii") + _WS_GUID).digest()).decode("ascii")


def parse_handshake(data: bytes, key: str) -> tuple[int, str, bytes] | None:
    """``(status, problem, rest)`` of the server's answer once its head is whole (None before):
    ``problem`` is "" for a valid 101 with the right accept value, else what is wrong (for a
    refusal, the start of its body); ``rest``: the bytes after the head (the first frames)."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    try:
        status = int(parts[1])
    except (IndexError, ValueError):
        return 0, f"not an HTTP answer: {lines[0][:80]!r}", rest
    if status != 101:
        return status, f"HTTP {status}: {rest[:300].decode('utf-8', 'replace')}", rest
    headers = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    if headers.get("sec-websocket-accept") != accept_value(key):
        return status, "wrong Sec-WebSocket-Accept", rest
    if headers.get("sec-websocket-extensions"):
        return status, f"an extension was forced on us: {headers['sec-websocket-extensions']}", rest
    return status, "", rest


# -- replies -----------------------------------------------------------------------------------
HEAD_BYTES: Final = 64
TAIL_BYTES: Final = 640
_DELTA_MARK: Final = b'audio.delta"'
_FRAME_INDEX: Final = b'"frame_index":'
_SAMPLES_END: Final = b'"input_samples_end":'
_DIGITS: Final = re.compile(rb"\d+")
NO_END: Final = -1  # a frame whose delta states no input_samples_end


def text_audio_delta(payload: bytes) -> tuple[int, int] | None:
    """``(frame_index, input_samples_end or NO_END)`` when the text message is an output audio
    delta (by its first bytes), else None. A delta whose frame index is not found where it is
    looked for is None too (the caller then parses it whole)."""
    if payload.find(_DELTA_MARK, 0, HEAD_BYTES) < 0:
        return None
    tail = max(0, len(payload) - TAIL_BYTES)
    at = payload.rfind(_FRAME_INDEX, tail)
    if at < 0:
        at = payload.find(_FRAME_INDEX, 0, 4 * HEAD_BYTES)
        if at < 0:
            return None
    index = _DIGITS.match(payload, at + len(_FRAME_INDEX))
    if index is None:
        return None
    at = payload.rfind(_SAMPLES_END, tail)
    end = None if at < 0 else _DIGITS.match(payload, at + len(_SAMPLES_END))
    return int(index.group()), (NO_END if end is None else int(end.group()))


def binary_frame_position(payload: bytes) -> tuple[int, int]:
    """``(frame_index, input_samples_end or NO_END)`` of a native binary output frame: the header
    is 8 bytes when the PCM16 after 4 would not be whole 80 ms frames (``protocol/native.py``)."""
    n = len(payload)
    if (n - 4) % FRAME_PCM16_BYTES and not (n - 8) % FRAME_PCM16_BYTES:
        index, end = _FRAME_POSITION_LE.unpack_from(payload)
        return int(index), int(end)
    return int(_FRAME_INDEX_LE.unpack_from(payload)[0]), NO_END


def delta_position(event: dict[str, Any]) -> tuple[int, int] | None:
    """``(frame_index, input_samples_end or NO_END)`` of a parsed JSON audio delta (Realtime:
    in ``metadata``; native: on the event), None for any other event."""
    kind = event.get("type")
    if not isinstance(kind, str) or not kind.endswith("audio.delta"):
        return None
    metadata = event.get("metadata")
    where = metadata if isinstance(metadata, dict) else event
    index, end = where.get("frame_index"), where.get("input_samples_end")
    if not isinstance(index, int):
        return None
    return index, end if isinstance(end, int) else NO_END


# -- what the sessions send ---------------------------------------------------------------------
TONE_HZ: Final = 1000  # 24 samples a period: every chunk of whole milliseconds is the same bytes
TONE_LEVEL: Final = 0.1


def tone_pcm16(samples: int) -> bytes:
    """``samples`` of a 1 kHz tone at -20 dBFS from phase 0, PCM16 LE at 24 kHz."""
    t = np.arange(samples, dtype=np.float64)
    x = np.sin(2 * np.pi * TONE_HZ * t / SAMPLE_RATE) * TONE_LEVEL * 32767
    return np.round(x).astype("<i2").tobytes()


class Messages:
    """The frames every session sends, each encoded once: the chunk, an alignment pad's shorter
    chunk (per pad value, on first use), the opening and the closing message.

    ``binary``: native audio as binary messages (an append carrying ``pad_ms`` is JSON, the only
    way to state a pad); else a Realtime ``input_audio_buffer.append`` with base64 PCM16."""

    def __init__(self, chunk_ms: int, *, binary: bool, opening: str) -> None:
        if chunk_ms <= 0 or chunk_ms * SAMPLE_RATE % 1000:
            raise ValueError(f"chunk_ms must be a positive whole number of samples, not {chunk_ms}")
        self.chunk_ms = chunk_ms
        self.chunk_samples = chunk_ms * SAMPLE_RATE // 1000
        self.binary = binary
        pcm = tone_pcm16(self.chunk_samples)
        self.chunk = (
            masked_frame(OP_BINARY, pcm) if binary else masked_frame(OP_TEXT, append_message(pcm).encode())
        )
        self.opening = masked_frame(OP_TEXT, opening.encode("utf-8"))
        self.session_close = masked_frame(OP_TEXT, b'{"type":"session.close"}')
        self.close = close_frame(1000)
        self._padded: dict[int, bytes] = {}

    def padded(self, pad_ms: int) -> tuple[bytes, int]:
        """The append sent ``pad_ms`` early after an alignment hint: ``80 - pad_ms`` ms of the
        tone with ``pad_ms`` on it, and its samples."""
        samples = FRAME_SAMPLES - pad_ms * SAMPLE_RATE // 1000
        frame = self._padded.get(pad_ms)
        if frame is None:
            text = append_message(tone_pcm16(samples), pad_ms=pad_ms)
            frame = self._padded[pad_ms] = masked_frame(OP_TEXT, text.encode())
        return frame, samples
