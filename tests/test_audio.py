"""audio.py's decoding of PCM16: every one of the 65536 values, as the plain cast and division make it."""

from __future__ import annotations

import numpy as np

from duplex_actors.audio import decode


def test_pcm16_decodes_to_the_cast_divided_by_32768_bit_for_bit() -> None:
    values = np.arange(-32768, 32768, dtype="<i2")
    got = decode(values.tobytes(), "pcm16")
    expected = values.astype(np.float32) / 32768.0
    assert got.dtype == np.float32 and got.flags.writeable and got.flags.c_contiguous
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))


def test_an_input_stream_gives_24_khz_pcm16_as_decode_does_and_refuses_a_half_sample() -> None:
    from duplex_actors.audio import AudioError, InputStream

    data = np.arange(-960, 960, dtype="<i2").tobytes()
    stream = InputStream()
    assert np.array_equal(stream.feed(data, "pcm16", 24000), decode(data, "pcm16"))
    try:
        stream.feed(data[:-1], "pcm16", 24000)
    except AudioError as exc:
        assert exc.code == "bad_audio" and "not a whole number" in str(exc)
    else:
        raise AssertionError("a half sample was decoded")
    # After a stretch at another rate, 24 kHz flushes that rate's resampler first, as before.
    stream.feed(data, "pcm16", 16000)
    assert len(stream.feed(data, "pcm16", 24000)) > len(data) // 2
