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
