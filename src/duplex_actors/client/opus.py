"""Ogg/Opus for the ``/api/chat`` clients: pre-encoded input pages and a cheap sample counter.

- :func:`encode_opus_messages`: 24 kHz mono float32 as ``0x01`` audio messages, one per 80 ms
  frame, the way ``moshi.client`` frames them (sphn 0.2 ``OpusStreamWriter.append_pcm(1920)``:
  two 40 ms packets, one page each; the OpusHead and OpusTags pages in the first message).
  Encoding is the expensive half of Opus (~1 ms of CPU per frame), so a load generator encodes
  once and sends the same bytes in every session.
- :class:`OggOpusCounter`: how many samples the Opus packets received so far hold, read from
  the Ogg segment tables and each packet's TOC byte (RFC 6716 section 3.1) without decoding:
  a few microseconds per message, so ``duplex-load`` can time every output frame of every
  session and decode only a sample of them.

sans-io apart from sphn (imported when encoding or decoding), no trio.
"""

from __future__ import annotations

import struct
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ..audio import FRAME_SAMPLES, SAMPLE_RATE

KIND_HANDSHAKE: Final = 0x00
KIND_AUDIO: Final = 0x01
KIND_TEXT: Final = 0x02
KIND_CONTROL: Final = 0x03
KIND_METADATA: Final = 0x04
KIND_ERROR: Final = 0x05
KIND_PING: Final = 0x06

_OGG_HEADER: Final = struct.Struct("<4sBBqIIIB")  # capture, version, type, granule, serial, seq, crc, nseg
# Opus frame duration in units of 2.5 ms (48 kHz: 120 samples), by TOC config (RFC 6716 table 2).
_SILK_UNITS: Final = (4, 8, 16, 24)
_HYBRID_UNITS: Final = (4, 8)
_CELT_UNITS: Final = (1, 2, 4, 8)
_SAMPLES_PER_UNIT_24K: Final = SAMPLE_RATE // 400  # 60 samples per 2.5 ms at 24 kHz


def opus_packet_samples(packet: bytes | memoryview, rate: int = SAMPLE_RATE) -> int:
    """Samples (at ``rate``) one Opus packet decodes to, from its TOC byte; 0 if malformed."""
    if not packet:
        return 0
    toc = packet[0]
    config = toc >> 3
    if config < 12:
        units = _SILK_UNITS[config % 4]
    elif config < 16:
        units = _HYBRID_UNITS[config % 2]
    else:
        units = _CELT_UNITS[config % 4]
    code = toc & 3
    if code == 0:
        count = 1
    elif code in (1, 2):
        count = 2
    else:
        if len(packet) < 2:
            return 0
        count = packet[1] & 0x3F
    return units * count * rate // 400


class OggOpusCounter:
    """Feed the Ogg bytes of ``0x01`` messages as they arrive; :meth:`feed` returns the samples
    of the Opus packets completed by them. Pages and packets may be split anywhere across
    messages; the OpusHead and OpusTags header packets count 0."""

    def __init__(self, rate: int = SAMPLE_RATE) -> None:
        self.rate = rate
        self.samples = 0
        self._buf = bytearray()
        self._packet = bytearray()  # a packet continued on the next page

    def feed(self, data: bytes | memoryview) -> int:
        self._buf += data
        buf = self._buf
        pos, got = 0, 0
        while True:
            if len(buf) - pos < _OGG_HEADER.size:
                break
            if buf[pos : pos + 4] != b"OggS":
                nxt = buf.find(b"OggS", pos + 1)
                if nxt < 0:
                    pos = max(pos, len(buf) - 3)  # keep a possible partial capture pattern
                    break
                pos = nxt
                continue
            nseg = buf[pos + 26]
            head = pos + _OGG_HEADER.size
            if len(buf) < head + nseg:
                break
            lacing = buf[head : head + nseg]
            body = head + nseg
            end = body + sum(lacing)
            if len(buf) < end:
                break
            at = body
            for lace in lacing:
                self._packet += buf[at : at + lace]
                at += lace
                if lace < 255:
                    got += self._packet_done()
            pos = end
        del buf[:pos]
        self.samples += got
        return got

    def _packet_done(self) -> int:
        packet = bytes(self._packet)
        self._packet.clear()
        if packet.startswith((b"OpusHead", b"OpusTags")):
            return 0
        return opus_packet_samples(packet, self.rate)


def encode_opus_messages(samples: npt.NDArray[np.floating]) -> tuple[bytes, ...]:
    """24 kHz mono audio as ``0x01`` messages, one per 80 ms frame (sphn 0.2's writer, as
    ``moshi.client`` sends it); a short last frame is zero-padded."""
    import sphn

    x = np.asarray(samples, dtype=np.float32)
    frames = -(-x.size // FRAME_SAMPLES)
    padded = np.zeros(frames * FRAME_SAMPLES, np.float32)
    padded[: x.size] = x
    writer: Any = sphn.OpusStreamWriter(SAMPLE_RATE)
    out = []
    for k in range(frames):
        pages = bytes(writer.append_pcm(padded[k * FRAME_SAMPLES : (k + 1) * FRAME_SAMPLES]))
        out.append(bytes([KIND_AUDIO]) + pages)
    return tuple(out)


class OpusDecoder:
    """sphn 0.2's streaming reader: Ogg bytes in, 24 kHz float32 out (synchronously)."""

    def __init__(self) -> None:
        import sphn

        self._reader: Any = sphn.OpusStreamReader(SAMPLE_RATE)

    def decode(self, data: bytes) -> npt.NDArray[np.float32]:
        pcm = self._reader.append_bytes(data)
        return np.asarray(pcm, dtype=np.float32).reshape(-1)
