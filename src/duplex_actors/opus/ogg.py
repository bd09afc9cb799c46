"""Ogg pages (RFC 3533), sans-io: an incremental validating page reader and a page writer.

:class:`OggPageReader` takes bytes in any split and returns each page once it is complete, after
checking its capture pattern, version, header-type bits and CRC; anything else raises
:class:`OggError` at the first byte that proves it. :func:`encode_page` / :func:`paginate` build
pages from packets (tests, the load client and clients that need a framing sphn does not make).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Sequence
from typing import Final

import attrs

CAPTURE: Final = b"OggS"
HEADER_BYTES: Final = 27
MAX_PAGE_BYTES: Final = HEADER_BYTES + 255 + 255 * 255

CONTINUED: Final = 0x01
BOS: Final = 0x02
EOS: Final = 0x04

_HEADER = struct.Struct("<4sBBqIIIB")
# zlib's CRC-32 is the bit-reflected form of the same polynomial (0x04C11DB7) that Ogg uses
# unreflected with init 0 and no final xor. Reversing the bits of every byte, taking zlib's CRC,
# undoing its init/xorout (by linearity: the CRC of as many zero bytes) and reversing the 32-bit
# result gives Ogg's CRC in C speed (tests compare it with the bitwise definition).
_REVERSE8: Final = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))
_ZERO_CRC: dict[int, int] = {}


class OggError(ValueError):
    """The bytes are not a valid Ogg stream; the message says where and why."""


def _reverse32(value: int) -> int:
    return int(f"{value:032b}"[::-1], 2)


def ogg_crc(data: bytes | bytearray | memoryview) -> int:
    """The CRC of RFC 3533 (poly 0x04C11DB7, init 0, unreflected, no final xor)."""
    data = bytes(data)
    n = len(data)
    zero = _ZERO_CRC.get(n)
    if zero is None:
        zero = zlib.crc32(bytes(n))
        if len(_ZERO_CRC) < 4096:
            _ZERO_CRC[n] = zero
    return _reverse32(zlib.crc32(data.translate(_REVERSE8)) ^ zero)


def ogg_crc_bitwise(data: bytes) -> int:
    """The same CRC, by its definition (slow; the reference the tests check :func:`ogg_crc` with)."""
    crc = 0
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else crc << 1
            crc &= 0xFFFFFFFF
    return crc


@attrs.frozen(slots=True)
class OggPage:
    header_type: int
    granule: int
    serial: int
    sequence: int
    lacing: bytes  # the segment table
    body: bytes
    raw: bytes  # the whole page as received

    @property
    def bos(self) -> bool:
        return bool(self.header_type & BOS)

    @property
    def eos(self) -> bool:
        return bool(self.header_type & EOS)

    @property
    def continued(self) -> bool:
        return bool(self.header_type & CONTINUED)

    def first_packet(self) -> bytes:
        """The bytes of the first packet that starts on this page (as far as this page holds it)."""
        start = 0
        if self.continued:  # the leading segments finish a packet from the previous page
            for i, size in enumerate(self.lacing):
                start += size
                if size < 255:
                    return self._packet_from(i + 1, start)
            return b""
        return self._packet_from(0, 0)

    def _packet_from(self, index: int, start: int) -> bytes:
        end = start
        for size in self.lacing[index:]:
            end += size
            if size < 255:
                break
        return self.body[start:end]


class OggPageReader:
    """Feed bytes in any split; get the pages they complete. Memory is bounded by one page."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.offset = 0  # stream offset of the start of the buffer (for messages)
        self.pages = 0

    @property
    def pending(self) -> int:
        """Bytes of an incomplete page held back."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[OggPage]:
        self._buffer += data
        pages: list[OggPage] = []
        while True:
            page = self._next()
            if page is None:
                return pages
            pages.append(page)

    def _next(self) -> OggPage | None:
        buf = self._buffer
        head = bytes(buf[:4])
        if not CAPTURE.startswith(head):
            raise OggError(f"no Ogg capture pattern at byte {self.offset} (page {self.pages}): got {head!r}")
        if len(buf) < HEADER_BYTES:
            return None
        _, version, header_type, granule, serial, sequence, crc, segments = _HEADER.unpack_from(buf)
        if version != 0:
            raise OggError(f"Ogg page {self.pages} at byte {self.offset}: stream structure version {version}")
        if header_type & ~(CONTINUED | BOS | EOS):
            raise OggError(
                f"Ogg page {self.pages} at byte {self.offset}: reserved header-type bits {header_type:#04x}"
            )
        if len(buf) < HEADER_BYTES + segments:
            return None
        lacing = bytes(buf[HEADER_BYTES : HEADER_BYTES + segments])
        size = HEADER_BYTES + segments + sum(lacing)
        if len(buf) < size:
            return None
        raw = bytes(buf[:size])
        check = bytearray(raw)
        check[22:26] = b"\0\0\0\0"
        if ogg_crc(check) != crc:
            raise OggError(f"Ogg page {self.pages} at byte {self.offset}: CRC mismatch")
        del buf[:size]
        self.offset += size
        self.pages += 1
        return OggPage(header_type, granule, serial, sequence, lacing, raw[HEADER_BYTES + segments :], raw)


def encode_page(
    packets: Sequence[bytes],
    *,
    serial: int,
    sequence: int,
    granule: int,
    header_type: int = 0,
) -> bytes:
    """One page holding whole ``packets`` (at most 255 segments), its CRC set."""
    lacing = bytearray()
    for packet in packets:
        full, rest = divmod(len(packet), 255)
        lacing += b"\xff" * full + bytes([rest])
    if len(lacing) > 255:
        raise ValueError(f"{len(packets)} packets need {len(lacing)} segments; a page has at most 255")
    header = _HEADER.pack(CAPTURE, 0, header_type, granule, serial, sequence, 0, len(lacing))
    page = bytearray(header + lacing + b"".join(packets))
    page[22:26] = struct.pack("<I", ogg_crc(page))
    return bytes(page)


def paginate(
    packets: Iterable[tuple[bytes, int]],
    *,
    serial: int,
    per_page: int,
    first_sequence: int = 2,
    eos: bool = False,
) -> list[bytes]:
    """Audio pages of ``per_page`` packets each; ``packets`` are (packet, samples at 48 kHz)."""
    pages: list[bytes] = []
    granule = 0
    batch: list[bytes] = []
    items = list(packets)
    for i, (packet, samples48) in enumerate(items):
        batch.append(packet)
        granule += samples48
        if len(batch) == per_page or i == len(items) - 1:
            last = i == len(items) - 1
            pages.append(
                encode_page(
                    batch,
                    serial=serial,
                    sequence=first_sequence + len(pages),
                    granule=granule,
                    header_type=EOS if (eos and last) else 0,
                )
            )
            batch = []
    return pages


def opus_head(*, pre_skip: int = 3840, input_rate: int = 24000, channels: int = 1) -> bytes:
    """An OpusHead packet (RFC 7845 §5.1), mapping family 0."""
    return b"OpusHead" + struct.pack("<BBHIhB", 1, channels, pre_skip, input_rate, 0, 0)


def opus_tags(vendor: str = "duplex-actors") -> bytes:
    """An OpusTags packet with no user comments (RFC 7845 §5.2)."""
    raw = vendor.encode()
    return b"OpusTags" + struct.pack("<I", len(raw)) + raw + struct.pack("<I", 0)
