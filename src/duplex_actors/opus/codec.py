"""Per-session Ogg/Opus codec state, sans-io (no trio): what one codec worker holds per stream.

::

    dec = OggOpusDecoder()
    pcm = dec.feed(data)      # float32 mono 24 kHz decoded so far (maybe empty), any byte split
    dec.discard(data)         # validate and consume, but drop the audio (pre-handshake input)
    enc = OggOpusEncoder()
    pages = enc.encode(pcm)   # 1920 float32 samples (80 ms) -> whole Ogg pages; the first
                              # call's bytes start with the OpusHead and OpusTags pages

sphn 0.2 does the Opus work (the library moshi uses). Its reader checks neither CRCs nor the
Opus headers and accepts garbage short of a page silently, so :class:`OggOpusDecoder` validates
the stream itself, page by page (:class:`~.ogg.OggPageReader`: capture pattern, version,
header-type bits, CRC32 of RFC 3533), checks RFC 7845's header sequence (a BOS page with
OpusHead, mono, then OpusTags, possibly over several pages) and hands each page to sphn as soon
as it is complete, so a client's chunking adds no latency. A new BOS page after the end of a
stream (a chained stream: a client that restarts its recorder) starts a new decoder. The first
error raises :class:`OpusUndecodable` (code ``bad_audio``; the dialect closes 1007); the decoder
then stays failed.

Pre-handshake audio must be dropped, but the stream it carries goes on: a client's first message
holds the header pages. :meth:`OggOpusDecoder.discard` validates those bytes and keeps the
stream's state (headers, partial page) without decoding audio, so the first audio after the
handshake decodes as usual.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import sphn

from .. import error_codes
from ..error_codes import CodedError
from .ogg import OggError, OggPage, OggPageReader

SAMPLE_RATE = 24000
FRAME_SAMPLES = 1920  # 80 ms

_EMPTY = np.zeros(0, dtype=np.float32)


class OpusUndecodable(CodedError):
    """Inbound audio that is not a valid Ogg/Opus stream (the dialect sends ``0x05`` + 1007)."""

    code = error_codes.BAD_AUDIO


class OggOpusDecoder:
    """An inbound Ogg/Opus stream, fed in any byte split; see the module docstring."""

    def __init__(self) -> None:
        self._pages = OggPageReader()
        self._reader: sphn.OpusStreamReader | None = None
        self._state = "head"  # head -> tags -> audio -> ended -> head (chained) ...
        self._serial: int | None = None
        self._failed: OpusUndecodable | None = None
        self.samples = 0  # decoded so far
        self.pages = 0

    @property
    def failed(self) -> bool:
        return self._failed is not None

    def feed(self, data: bytes) -> npt.NDArray[np.float32]:
        """Float32 mono 24 kHz samples decoded from the pages ``data`` completes (maybe none)."""
        return self._consume(data, decode=True)

    def discard(self, data: bytes) -> None:
        """Validate and consume ``data`` like :meth:`feed`, but decode no audio."""
        self._consume(data, decode=False)

    def _consume(self, data: bytes, *, decode: bool) -> npt.NDArray[np.float32]:
        if self._failed is not None:
            raise self._failed
        try:
            pages = self._pages.feed(data)
            out = [pcm for page in pages if (pcm := self._page(page, decode)).size]
        except OggError as exc:
            self._failed = OpusUndecodable(str(exc))
            raise self._failed from None
        except OpusUndecodable as exc:
            self._failed = exc
            raise
        if not out:
            return _EMPTY
        pcm = out[0] if len(out) == 1 else np.concatenate(out)
        self.samples += pcm.size
        return pcm

    def _fail(self, page: OggPage, why: str) -> OpusUndecodable:
        return OpusUndecodable(f"Ogg page {self.pages} (sequence {page.sequence}): {why}")

    def _page(self, page: OggPage, decode: bool) -> npt.NDArray[np.float32]:
        self.pages += 1
        if page.bos:
            if self._state not in ("head", "ended", "audio"):
                raise self._fail(page, "a new stream began inside the Opus headers")
            self._head(page)
            return _EMPTY
        if self._state in ("head", "ended"):
            what = "the first page" if self._state == "head" else "a page after the end of the stream"
            raise self._fail(page, f"{what} is not a beginning-of-stream page with OpusHead")
        if page.serial != self._serial:
            raise self._fail(page, f"serial {page.serial:#x} is not the Opus stream's {self._serial:#x}")
        assert self._reader is not None
        if self._state == "tags":
            if not page.continued and not page.first_packet().startswith(b"OpusTags"):
                raise self._fail(page, "the second packet is not OpusTags")
            self._give(page)
            if page.lacing and page.lacing[-1] < 255:  # the OpusTags packet ends on this page
                self._state = "audio"
            return _EMPTY
        pcm = self._give(page) if decode else _EMPTY
        if page.eos:
            self._state = "ended"
        return pcm

    def _head(self, page: OggPage) -> None:
        head = page.first_packet()
        if not head.startswith(b"OpusHead") or len(head) < 19:
            raise self._fail(page, "the beginning-of-stream page does not hold an OpusHead (not Opus)")
        if head[8] >> 4 != 0:
            raise self._fail(page, f"OpusHead version {head[8]} is not supported")
        if head[9] != 1:
            raise self._fail(page, f"{head[9]} channels: only mono Opus is accepted")
        if len(page.lacing) != 1 or page.lacing[0] == 255:
            raise self._fail(page, "the OpusHead page must hold exactly the OpusHead packet")
        self._serial = page.serial
        self._reader = sphn.OpusStreamReader(SAMPLE_RATE)
        self._state = "tags"
        self._give(page)

    def _give(self, page: OggPage) -> npt.NDArray[np.float32]:
        assert self._reader is not None
        try:
            pcm = self._reader.append_bytes(page.raw)
        except (ValueError, RuntimeError) as exc:
            raise self._fail(page, f"Opus decoding failed: {exc}") from None
        return np.asarray(pcm, dtype=np.float32).reshape(-1)


class OggOpusEncoder:
    """An outbound Ogg/Opus stream: float32 mono 24 kHz in, whole Ogg pages out.

    sphn re-chunks into 40 ms packets, one per page, so 1920 samples give two pages; a length
    that is not a multiple of 960 keeps its remainder for the next call."""

    def __init__(self) -> None:
        self._writer = sphn.OpusStreamWriter(SAMPLE_RATE)
        self.samples = 0

    def encode(self, pcm: npt.ArrayLike) -> bytes:
        samples = np.ascontiguousarray(pcm, dtype=np.float32)
        if samples.ndim != 1:
            raise ValueError(f"expected mono samples (1-D), got shape {samples.shape}")
        self.samples += samples.size
        out = self._writer.append_pcm(samples)
        return bytes(out)
