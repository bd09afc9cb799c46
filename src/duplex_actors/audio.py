"""Audio as every layer sees it (sans-io, numpy only): the frame and rate constants and the input formats.

The model, the session core, the wire protocol and the clients all work in 80 ms frames of 1920
mono samples at 24 kHz; this module is the one place that says so. It imports nothing of this
package, so any layer may import it.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from .errors import CodedError

SAMPLE_RATE: Final = 24_000
FRAME_MS: Final = 80
FRAME_SAMPLES: Final = SAMPLE_RATE * FRAME_MS // 1000  # 1920
FRAME_S: Final = FRAME_MS / 1000
FRAME_PCM16_BYTES: Final = 2 * FRAME_SAMPLES  # 3840

# Input formats on the wire and in the session log: name -> bytes per sample.
FORMATS: Final = {"pcm16": 2, "pcm_f32le": 4}
ALIASES: Final = {"pcm16": "pcm16", "audio/pcm": "pcm16", "pcm_s16le": "pcm16", "pcm_f32le": "pcm_f32le"}


class AudioError(CodedError, ValueError):
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
            f"unsupported input audio format {name!r}; use pcm16 or pcm_f32le (mono, {SAMPLE_RATE} Hz)",
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


def float_to_pcm16(samples: npt.NDArray[np.floating]) -> bytes:
    """Clip to [-1, 1) and round to 16-bit little-endian PCM (computed in float32)."""
    x = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 32767 / 32768)
    return (x * 32768.0).round().astype("<i2").tobytes()
