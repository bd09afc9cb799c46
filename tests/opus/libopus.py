"""Opus packets of any frame size from the system libopus (ctypes), for framings sphn's writer
never makes (the web UI's 20 ms packets, PersonaPlex's 80 ms ones). scripts/setup-test-deps.sh
installs libopus0 before pytest starts; tests skip without it (a failure under CI=true)."""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
import pytest

from duplex_actors.opus.ogg import BOS, encode_page, opus_head, opus_tags, paginate
from tests.system_tools import SETUP

APPLICATION_VOIP = 2048
APPLICATION_AUDIO = 2049


def _lib() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("opus")
    if name is None:
        return None
    lib = ctypes.CDLL(name)
    lib.opus_encoder_create.restype = ctypes.c_void_p
    lib.opus_encoder_create.argtypes = [
        ctypes.c_int32,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_int),
    ]
    lib.opus_encode_float.restype = ctypes.c_int32
    lib.opus_encode_float.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_float),
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int32,
    ]
    lib.opus_encoder_destroy.argtypes = [ctypes.c_void_p]
    return lib


LIB = _lib()
needs_libopus = pytest.mark.skipif(
    LIB is None, reason=f"the system libopus is not installed: run {SETUP} (make test does)"
)


def opus_packets(pcm: np.ndarray, frame: int, application: int = APPLICATION_AUDIO) -> list[bytes]:
    """``pcm`` (float32, 24 kHz mono) as Opus packets of ``frame`` samples each."""
    assert LIB is not None
    err = ctypes.c_int()
    enc = LIB.opus_encoder_create(24000, 1, application, ctypes.byref(err))
    assert err.value == 0 and enc
    try:
        out = ctypes.create_string_buffer(4000)
        packets = []
        samples = np.ascontiguousarray(pcm, dtype=np.float32)
        for start in range(0, samples.size - frame + 1, frame):
            chunk = samples[start : start + frame]
            n = LIB.opus_encode_float(
                enc, chunk.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), frame, out, 4000
            )
            assert n > 0, n
            packets.append(out.raw[:n])
        return packets
    finally:
        LIB.opus_encoder_destroy(enc)


def ogg_stream(
    packets: list[bytes], frame: int, per_page: int, serial: int = 0x5EED
) -> tuple[list[bytes], list[bytes]]:
    """(header pages, audio pages) of an Ogg/Opus stream of ``packets`` (``frame`` samples at 24 kHz)."""
    headers = [
        encode_page([opus_head()], serial=serial, sequence=0, granule=0, header_type=BOS),
        encode_page([opus_tags()], serial=serial, sequence=1, granule=0),
    ]
    audio = paginate(((p, frame * 2) for p in packets), serial=serial, per_page=per_page)
    return headers, audio
