"""Input audio decoding and validation (sans-io): bytes in a wire format -> float32 samples."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FORMATS = {"pcm16": 2, "pcm_f32le": 4}
ALIASES = {"pcm16": "pcm16", "audio/pcm": "pcm16", "pcm_s16le": "pcm16", "pcm_f32le": "pcm_f32le"}


class AudioError(ValueError):
    """``code`` is the wire error code: bad_audio or unsupported_audio_format."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def canonical_format(name: str) -> str:
    try:
        return ALIASES[name]
    except KeyError:
        raise AudioError(
            "unsupported_audio_format",
            f"unsupported input audio format {name!r}; use pcm16 or pcm_f32le (mono, 24000 Hz)",
        ) from None


def decode(data: bytes, fmt: str) -> npt.NDArray[np.float32]:
    """Decode mono 24 kHz audio; raises AudioError for a bad length or non-finite samples."""
    fmt = canonical_format(fmt)
    width = FORMATS[fmt]
    if len(data) % width:
        raise AudioError("bad_audio", f"{len(data)} bytes is not a whole number of {fmt} samples")
    if fmt == "pcm16":
        samples: npt.NDArray[np.float32] = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
        return samples
    samples = np.frombuffer(data, dtype="<f4").astype(np.float32)
    if not np.isfinite(samples).all():
        raise AudioError("bad_audio", "pcm_f32le audio contains NaN or infinite samples")
    return samples


def encode_f32(samples: npt.NDArray[np.float32]) -> bytes:
    return np.ascontiguousarray(samples, dtype="<f4").tobytes()


def float_to_pcm16(samples: npt.NDArray[np.float32]) -> bytes:
    clipped = np.clip(samples, -1.0, 32767 / 32768)
    return (np.round(clipped * 32768.0)).astype("<i2").tobytes()
