"""Audio as every layer sees it (sans-io: numpy and soxr): frame and rate constants, the wire
formats, G.711, and the per-session streaming converters.

The model, the session core, the wire protocol and the clients all work in 80 ms frames of 1920
mono samples at 24 kHz; this module is the one place that says so. It imports nothing of this
package, so any layer may import it.

Input (docs/protocol.md §3) is pcm16 or pcm_f32le at one of :data:`INPUT_RATES`, or G.711 mu-law/A-law at
8 kHz; :class:`InputStream` turns a session's appends, in order, into 24 kHz float32 with one
``soxr.ResampleStream`` per (format, rate) run. soxr is deterministic and its streaming output
does not depend on how the input was split, so the model input is a function of the logged
appends alone (replay rebuilds the state by feeding the same appends). Output is pcm16 @ 24 kHz
or G.711 @ 8 kHz (:class:`OutputStream`, whole 80 ms frames).
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt
import soxr

from . import error_codes
from .error_codes import CodedError

SAMPLE_RATE: Final = 24_000
FRAME_MS: Final = 80
FRAME_SAMPLES: Final = SAMPLE_RATE * FRAME_MS // 1000  # 1920
FRAME_S: Final = FRAME_MS / 1000
FRAME_PCM16_BYTES: Final = 2 * FRAME_SAMPLES  # 3840

# Formats on the wire and in the session log: canonical name -> bytes per sample.
FORMATS: Final = {"pcm16": 2, "pcm_f32le": 4, "g711_ulaw": 1, "g711_alaw": 1}
ALIASES: Final = {
    "pcm16": "pcm16",
    "audio/pcm": "pcm16",
    "pcm_s16le": "pcm16",
    "pcm_f32le": "pcm_f32le",
    "g711_ulaw": "g711_ulaw",
    "audio/pcmu": "g711_ulaw",
    "pcmu": "g711_ulaw",
    "g711_alaw": "g711_alaw",
    "audio/pcma": "g711_alaw",
    "pcma": "g711_alaw",
}
G711_RATE: Final = 8000
INPUT_RATES: Final = (8000, 16000, 22050, 24000, 32000, 44100, 48000)
OUTPUT_FORMATS: Final = {"pcm16": SAMPLE_RATE, "g711_ulaw": G711_RATE, "g711_alaw": G711_RATE}
SUPPORTED_INPUT: Final = (
    f"pcm16 (audio/pcm) or pcm_f32le at {', '.join(map(str, INPUT_RATES))} Hz; "
    f"g711_ulaw (audio/pcmu) or g711_alaw (audio/pcma) at {G711_RATE} Hz; mono"
)
SUPPORTED_OUTPUT: Final = f"pcm16 (audio/pcm) at {SAMPLE_RATE} Hz, or g711_ulaw/g711_alaw at {G711_RATE} Hz"
QUALITY: Final = "HQ"  # soxr's default: what librosa uses


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
            error_codes.UNSUPPORTED_AUDIO_FORMAT,
            f"unsupported audio format {name!r}; supported: {SUPPORTED_INPUT}",
        ) from None


def default_rate(fmt: str) -> int:
    return G711_RATE if canonical_format(fmt).startswith("g711") else SAMPLE_RATE


def check_rate(fmt: str, rate: int) -> int:
    """``rate`` if ``fmt`` takes it; else AudioError(unsupported_audio_format)."""
    fmt = canonical_format(fmt)
    ok = rate == G711_RATE if fmt.startswith("g711") else rate in INPUT_RATES
    if not ok:
        raise AudioError(
            error_codes.UNSUPPORTED_AUDIO_FORMAT,
            f"unsupported sample rate {rate} Hz for {fmt}; supported: {SUPPORTED_INPUT}",
        )
    return rate


def canonical_output_format(name: str) -> str:
    fmt = ALIASES.get(name)
    if fmt not in OUTPUT_FORMATS:
        raise AudioError(
            error_codes.UNSUPPORTED_AUDIO_FORMAT,
            f"unsupported output format {name!r}; supported: {SUPPORTED_OUTPUT}",
        )
    return fmt


# -- G.711 (ITU-T G.711; the tables are the classic Sun g711.c algorithm) ---------------------
def _ulaw_decode_table() -> npt.NDArray[np.int16]:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, 0x84 - t, t - 0x84).astype(np.int16)


def _alaw_decode_table() -> npt.NDArray[np.int16]:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    seg = (a & 0x70) >> 4
    t = (a & 0x0F) << 4
    t = np.where(seg == 0, t + 8, np.where(seg == 1, t + 0x108, (t + 0x108) << np.maximum(seg - 1, 0)))
    return np.where(a & 0x80, t, -t).astype(np.int16)


def _encode_table(decode: npt.NDArray[np.int16]) -> npt.NDArray[np.uint8]:
    """For every 16-bit value, the code whose decoded value is nearest (ties: the smaller
    magnitude code), i.e. the G.711 quantiser, as a 65536-entry table indexed by ``x + 32768``."""
    order = np.argsort(decode, kind="stable")
    values = decode[order].astype(np.int32)
    x = np.arange(-32768, 32768, dtype=np.int32)
    hi = np.clip(np.searchsorted(values, x), 1, len(values) - 1)
    lo = hi - 1
    pick = np.where(np.abs(values[hi] - x) < np.abs(x - values[lo]), hi, lo)
    table: npt.NDArray[np.uint8] = order[pick].astype(np.uint8)
    return table


ULAW_TO_PCM16: Final = _ulaw_decode_table()
ALAW_TO_PCM16: Final = _alaw_decode_table()
PCM16_TO_ULAW: Final = _encode_table(ULAW_TO_PCM16)
PCM16_TO_ALAW: Final = _encode_table(ALAW_TO_PCM16)
_G711_DECODE: Final = {"g711_ulaw": ULAW_TO_PCM16, "g711_alaw": ALAW_TO_PCM16}
_G711_ENCODE: Final = {"g711_ulaw": PCM16_TO_ULAW, "g711_alaw": PCM16_TO_ALAW}


_PCM16: Final = np.dtype("<i2")
_PCM16_SCALE: Final = np.float32(1 / 32768)


def decode(data: bytes, fmt: str) -> npt.NDArray[np.float32]:
    """Decode mono audio at its own rate to float32; raises AudioError for a bad length or
    non-finite samples."""
    fmt = canonical_format(fmt)
    width = FORMATS[fmt]
    if len(data) % width:
        raise AudioError(error_codes.BAD_AUDIO, f"{len(data)} bytes is not a whole number of {fmt} samples")
    if fmt == "pcm16":
        # One ufunc casts and scales (x / 32768 and x * 2**-15 are the same float32 values).
        samples: npt.NDArray[np.float32] = np.multiply(
            np.frombuffer(data, dtype=_PCM16), _PCM16_SCALE, dtype=np.float32
        )
        return samples
    if fmt in _G711_DECODE:
        codes = np.frombuffer(data, dtype=np.uint8)
        samples = _G711_DECODE[fmt][codes].astype(np.float32) / 32768.0
        return samples
    samples = np.frombuffer(data, dtype="<f4").astype(np.float32)
    if not np.isfinite(samples).all():
        raise AudioError(error_codes.BAD_AUDIO, "pcm_f32le audio contains NaN or infinite samples")
    return samples


def encode_g711(pcm16: bytes, fmt: str) -> bytes:
    """PCM16 LE -> one G.711 byte per sample (same rate)."""
    x = np.frombuffer(pcm16, dtype="<i2").astype(np.int32) + 32768
    return _G711_ENCODE[canonical_format(fmt)][x].tobytes()


class InputStream:
    """A session's input, any supported format and rate, as 24 kHz float32 (sans-io, stateful).

    One soxr stream per run of appends with the same rate; a change of rate flushes the old
    stream (its delayed tail goes out) before the new one starts; :meth:`reset` drops the
    state (input_audio_buffer.clear)."""

    def __init__(self) -> None:
        self._rate = SAMPLE_RATE
        self._stream: soxr.ResampleStream | None = None

    def reset(self) -> None:
        self._rate = SAMPLE_RATE
        self._stream = None

    def feed(self, data: bytes, fmt: str, rate: int) -> npt.NDArray[np.float32]:
        """Decode and resample one append; raises AudioError (nothing is consumed then)."""
        check_rate(fmt, rate)
        samples = decode(data, fmt)
        if rate == self._rate and self._stream is None:
            return samples  # 24 kHz after 24 kHz (every frame's case): nothing to resample or flush
        out: list[npt.NDArray[np.float32]] = []
        if rate != self._rate:
            if self._stream is not None:
                out.append(self._stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True))
            self._rate = rate
            self._stream = None if rate == SAMPLE_RATE else self._new(rate)
        if self._stream is None:
            out.append(samples)
        else:
            out.append(self._stream.resample_chunk(samples))
        result = out[0] if len(out) == 1 else np.concatenate(out)
        return np.asarray(result, dtype=np.float32)

    @staticmethod
    def _new(rate: int) -> soxr.ResampleStream:
        return soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32", quality=QUALITY)


class OutputStream:
    """24 kHz PCM16 frames in, the session's output format out, one whole 80 ms frame per
    frame (3840 bytes of pcm16, 640 of G.711). G.711 is resampled to 8 kHz by a soxr stream,
    which delivers in irregular batches: a frame it cannot fill yet is completed with leading
    silence, which only happens in the first frames (the delay then stays that large)."""

    def __init__(self, fmt: str = "pcm16") -> None:
        self.format = canonical_output_format(fmt)
        self.rate = OUTPUT_FORMATS[self.format]
        self._frame = self.rate * FRAME_MS // 1000
        self._stream = (
            None
            if self.format == "pcm16"
            else soxr.ResampleStream(SAMPLE_RATE, self.rate, 1, dtype="int16", quality=QUALITY)
        )
        self._fifo: npt.NDArray[np.int16] = np.zeros(0, dtype=np.int16)
        self.padded_samples = 0

    def encode(self, pcm16: bytes) -> bytes:
        """Whole 24 kHz frames of PCM16 in, as many whole output frames out."""
        if self._stream is None:
            return pcm16
        frames = len(pcm16) // FRAME_PCM16_BYTES
        got = self._stream.resample_chunk(np.frombuffer(pcm16, dtype="<i2"))
        fifo = np.concatenate([self._fifo, got]) if len(self._fifo) else np.asarray(got, dtype=np.int16)
        need = frames * self._frame
        if len(fifo) < need:
            self.padded_samples += need - len(fifo)
            fifo = np.concatenate([np.zeros(need - len(fifo), dtype=np.int16), fifo])
        self._fifo = fifo[need:]
        return encode_g711(fifo[:need].astype("<i2").tobytes(), self.format)


def encode_f32(samples: npt.NDArray[np.float32]) -> bytes:
    return np.ascontiguousarray(samples, dtype="<f4").tobytes()


def float_to_pcm16(samples: npt.NDArray[np.floating]) -> bytes:
    """Clip to [-1, 1) and round to 16-bit little-endian PCM (computed in float32)."""
    return float_to_pcm16_array(samples).tobytes()


def float_to_pcm16_array(samples: npt.NDArray[np.floating]) -> npt.NDArray[np.int16]:
    """:func:`float_to_pcm16` as an array of little-endian int16."""
    x = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 32767 / 32768)
    return (x * 32768.0).round().astype("<i2")
