"""The sans-io codec: every client framing decodes, malformed Ogg is refused, round trips hold."""

from __future__ import annotations

import numpy as np
import pytest
import sphn

from duplex_actors.error_codes import BAD_AUDIO, CodedError
from duplex_actors.opus.codec import FRAME_SAMPLES, OggOpusDecoder, OggOpusEncoder, OpusUndecodable
from duplex_actors.opus.ogg import BOS, EOS, OggPageReader, encode_page, opus_head, opus_tags

from .libopus import needs_libopus, ogg_stream, opus_packets

SR = 24000


def tone(seconds: float, hz: float = 220.0, amp: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    # a voiced-like signal: a few harmonics with a slow vibrato
    x = sum(amp / k * np.sin(2 * np.pi * hz * k * t + 0.3 * np.sin(2 * np.pi * 3 * t)) for k in (1, 2, 3))
    return np.asarray(x, dtype=np.float32)


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if x.size else 0.0


def feed_all(messages: list[bytes], decoder: OggOpusDecoder | None = None) -> np.ndarray:
    decoder = decoder or OggOpusDecoder()
    out = [decoder.feed(m) for m in messages]
    return np.concatenate(out) if out else np.zeros(0, np.float32)


def sphn_stream(frames: int) -> list[bytes]:
    """What moshi's server and Python client send: one append_pcm(1920) per message."""
    writer = sphn.OpusStreamWriter(SR)
    x = tone(frames * FRAME_SAMPLES / SR)
    return [writer.append_pcm(x[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES]) for i in range(frames)]


def split(blob: bytes, step: int) -> list[bytes]:
    return [blob[i : i + step] for i in range(0, len(blob), step)]


# -- the sphn framing (2 pages of 40 ms per message, headers concatenated into the first) --------
@pytest.mark.parametrize("how", ["messages", "7-byte fragments", "one blob", "pages", "mid-page splits"])
def test_sphn_framings_decode_every_sample(how):
    messages = sphn_stream(12)
    blob = b"".join(messages)
    if how == "messages":
        chunks = messages
    elif how == "7-byte fragments":
        chunks = split(blob, 7)
    elif how == "one blob":
        chunks = [blob]
    elif how == "pages":
        chunks = [p.raw for p in OggPageReader().feed(blob)]
    else:
        chunks = split(blob, 333)
    pcm = feed_all(chunks)
    assert pcm.dtype == np.float32 and pcm.ndim == 1
    assert pcm.size == 12 * FRAME_SAMPLES
    assert rms(pcm[2 * FRAME_SAMPLES :]) > 0.1


def test_each_page_is_decoded_as_soon_as_it_completes():
    blob = b"".join(sphn_stream(3))
    pages = [p.raw for p in OggPageReader().feed(blob)]
    assert len(pages) == 2 + 6  # OpusHead, OpusTags, then one 40 ms packet per page
    decoder = OggOpusDecoder()
    assert decoder.feed(pages[0] + pages[1]).size == 0
    for page in pages[2:]:
        assert decoder.feed(page[:-1]).size == 0
        assert decoder.feed(page[-1:]).size == 960


# -- hand-made framings from libopus: 20/40/80 ms packets, 1-2 per page -------------------------
@needs_libopus
@pytest.mark.parametrize("frame_ms", [20, 40, 80])
@pytest.mark.parametrize("per_page", [1, 2])
@pytest.mark.parametrize("headers", ["separate", "concatenated"])
def test_client_framings(frame_ms, per_page, headers):
    frame = SR * frame_ms // 1000
    x = tone(1.28)
    packets = opus_packets(x, frame)
    head, audio = ogg_stream(packets, frame, per_page)
    if headers == "separate":  # the web UIs and PersonaPlex: each header page its own message
        messages = [*head, *audio]
    else:  # moshi / sphn: both header pages with the first audio
        messages = [head[0] + head[1] + audio[0], *audio[1:]]
    pcm = feed_all(messages)
    assert pcm.size == len(packets) * frame
    assert rms(pcm[FRAME_SAMPLES:]) > 0.5 * rms(x)
    # the same stream in 7-byte fragments decodes to the same samples
    assert np.array_equal(feed_all(split(b"".join(messages), 7)), pcm)


@needs_libopus
def test_web_ui_stream_with_eos_and_a_chained_restart():
    frame = 480
    first = ogg_stream(opus_packets(tone(0.4), frame), frame, 2, serial=1)
    second = ogg_stream(opus_packets(tone(0.4, 330), frame), frame, 2, serial=2)
    last = first[1][-1]
    # mark the first stream's last page EOS (rewrite it: the CRC covers the flag)
    reader_page = OggPageReader().feed(last)[0]
    packets = [reader_page.body[: reader_page.lacing[0]], reader_page.body[reader_page.lacing[0] :]]
    eos = encode_page(
        packets, serial=1, sequence=reader_page.sequence, granule=reader_page.granule, header_type=EOS
    )
    messages = [*first[0], *first[1][:-1], eos, *second[0], *second[1]]
    pcm = feed_all(messages)
    assert pcm.size == 2 * 20 * frame


def test_discard_keeps_the_stream_state():
    """Pre-handshake input: the headers (and a partial page) count, the audio is dropped."""
    blob = b"".join(sphn_stream(10))
    cut = 1000  # mid-page
    decoder = OggOpusDecoder()
    decoder.discard(blob[:cut])
    pcm = decoder.feed(blob[cut:])
    complete_before = sum(len(p.raw) for p in OggPageReader().feed(blob[:cut]))
    pages_after = OggPageReader().feed(blob[complete_before:])
    assert pcm.size == 960 * len(pages_after)
    assert 0 < pcm.size < 10 * FRAME_SAMPLES
    with pytest.raises(OpusUndecodable):
        OggOpusDecoder().discard(b"garbage!")


# -- refusals -------------------------------------------------------------------------------------
def _good_head() -> list[bytes]:
    return [
        encode_page([opus_head()], serial=9, sequence=0, granule=0, header_type=BOS),
        encode_page([opus_tags()], serial=9, sequence=1, granule=0),
    ]


def _refused(data: bytes, match: str) -> OpusUndecodable:
    decoder = OggOpusDecoder()
    with pytest.raises(OpusUndecodable, match=match) as info:
        for chunk in split(data, 50):
            decoder.feed(chunk)
    assert decoder.failed
    with pytest.raises(OpusUndecodable):  # it stays failed
        decoder.feed(b"")
    return info.value


def test_malformed_ogg_is_refused_with_bad_audio():
    blob = b"".join(sphn_stream(3))
    exc = _refused(b"RIFF\x00\x00\x00\x00WAVEfmt ", "capture pattern")
    assert isinstance(exc, CodedError) and exc.code == BAD_AUDIO
    corrupt = bytearray(blob)
    corrupt[len(blob) - 5] ^= 0x40
    _refused(bytes(corrupt), "CRC")
    vorbis = encode_page([b"\x01vorbis" + bytes(23)], serial=1, sequence=0, granule=0, header_type=BOS)
    _refused(vorbis, "not Opus")
    _refused(_good_head()[1], "beginning-of-stream")  # audio or tags without a head
    stereo = encode_page([opus_head(channels=2)], serial=9, sequence=0, granule=0, header_type=BOS)
    _refused(stereo, "mono")
    head, tags = _good_head()
    no_tags = encode_page([b"\xfc\xff\xfe"], serial=9, sequence=1, granule=960)
    _refused(head + no_tags, "OpusTags")
    other_serial = encode_page([opus_tags()], serial=10, sequence=1, granule=0)
    _refused(head + other_serial, "serial")
    after_eos = encode_page([b"\xfc\xff\xfe"], serial=9, sequence=2, granule=960, header_type=EOS)
    more = encode_page([b"\xfc\xff\xfe"], serial=9, sequence=3, granule=1920)
    _refused(head + tags + after_eos + more, "after the end")


def test_random_bytes_never_escape_as_another_exception():
    rng = np.random.default_rng(3)
    for _ in range(200):
        data = b"OggS" + rng.integers(0, 256, int(rng.integers(0, 400)), dtype=np.uint8).tobytes()
        decoder = OggOpusDecoder()
        try:
            decoder.feed(data)
        except OpusUndecodable:
            pass


# -- encoder and round trip -----------------------------------------------------------------------
def test_encoder_pages_headers_first_and_round_trip():
    x = tone(2.0)
    encoder = OggOpusEncoder()
    chunks = [encoder.encode(x[i : i + FRAME_SAMPLES]) for i in range(0, x.size, FRAME_SAMPLES)]
    first = OggPageReader().feed(chunks[0])
    assert first[0].bos and first[0].body.startswith(b"OpusHead")
    assert first[1].body.startswith(b"OpusTags")
    assert len(first) == 4  # the headers, then two 40 ms pages
    for chunk in chunks[1:]:  # every later call: whole pages, two of them
        pages = OggPageReader().feed(chunk)
        assert len(pages) == 2 and b"".join(p.raw for p in pages) == chunk
    pcm = feed_all(chunks)
    assert pcm.size == x.size
    assert rms(pcm[FRAME_SAMPLES:]) > 0.5 * rms(x)
    # silence stays (near) silent: the energy above is the signal's, not codec noise
    silent = OggOpusEncoder()
    quiet = feed_all([silent.encode(np.zeros(FRAME_SAMPLES, np.float32)) for _ in range(10)])
    assert quiet.size == 10 * FRAME_SAMPLES and rms(quiet) < 0.01


def test_encoder_refuses_non_mono():
    with pytest.raises(ValueError, match="mono"):
        OggOpusEncoder().encode(np.zeros((FRAME_SAMPLES, 2), np.float32))
    # float64 input is converted, not refused
    assert OggOpusEncoder().encode(np.zeros(FRAME_SAMPLES)).startswith(b"OggS")
