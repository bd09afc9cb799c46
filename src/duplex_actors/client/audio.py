"""Audio helpers for the clients (numpy and soxr, no torch, no model).

- :func:`read_wav`: any RIFF/WAVE file a user is likely to have (8/16/24/32-bit PCM, 32/64-bit
  float, ``WAVE_FORMAT_EXTENSIBLE``, any rate, any channel count) as float32 ``(frames, channels)``.
- :func:`to_model_input`: downmix to mono and resample to 24 kHz (soxr, as the server does).
- :func:`write_wav`: PCM16 mono WAV.
- :func:`float_to_pcm16` / :func:`pcm16_to_float`, and :func:`speech_like`: deterministic
  synthetic speech-like audio (voiced harmonics with a moving pitch, syllable envelope, pauses and
  a little breath noise) for load tests and examples.
- :func:`parse_input_format` / :func:`parse_output_format`: ``pcm16@48000``, ``pcmu``, ... as a
  :class:`WireFormat` (canonical name and rate, checked against what the server takes).
- :func:`to_wire_bytes`, :func:`append_message` and :func:`encode_audio`: audio as the bytes of a
  session input format (pcm16, pcm_f32le or G.711) and as ready ``input_audio_buffer.append``
  messages (built with the protocol's own encoder).

The frame and rate constants and the PCM conversion are :mod:`duplex_actors.audio`'s.
"""

from __future__ import annotations

import base64
import struct
import wave
from pathlib import Path
from typing import Any, Final

import attrs
import numpy as np
import numpy.typing as npt
import soxr

from .. import error_codes
from ..audio import (
    FORMATS,
    FRAME_MS,
    FRAME_SAMPLES,
    G711_RATE,
    INPUT_RATES,
    OUTPUT_FORMATS,
    QUALITY,
    SAMPLE_RATE,
    AudioError,
    InputStream,
    canonical_format,
    canonical_output_format,
    check_rate,
    default_rate,
    encode_g711,
    float_to_pcm16,
)
from ..protocol.converter import dumps, encode_client_event
from ..protocol.wire_events import InputAudioBufferAppend

Float32Array = npt.NDArray[np.float32]
AudioInput = bytes | bytearray | memoryview | npt.NDArray[Any]

_PCM: Final = 1
_FLOAT: Final = 3
_EXTENSIBLE: Final = 0xFFFE


class WavError(ValueError):
    """The file is not a WAV file this reader understands."""


def _decode_samples(data: bytes, tag: int, bits: int, channels: int) -> Float32Array:
    width = bits // 8
    usable = len(data) - len(data) % (width * channels)
    data = data[:usable]
    if tag == _PCM:
        if bits == 8:
            x = (np.frombuffer(data, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
        elif bits == 16:
            x = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
        elif bits == 24:
            raw = np.frombuffer(data, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
            ints = raw[:, 0] | (raw[:, 1] << 8) | (raw[:, 2] << 16)
            ints = np.where(ints >= 1 << 23, ints - (1 << 24), ints)
            x = ints.astype(np.float32) / float(1 << 23)
        elif bits == 32:
            x = (np.frombuffer(data, dtype="<i4").astype(np.float64) / 2147483648.0).astype(np.float32)
        else:
            raise WavError(f"unsupported PCM sample width: {bits} bits")
    elif tag == _FLOAT:
        if bits == 32:
            x = np.frombuffer(data, dtype="<f4").astype(np.float32)
        elif bits == 64:
            x = np.frombuffer(data, dtype="<f8").astype(np.float32)
        else:
            raise WavError(f"unsupported float sample width: {bits} bits")
        x = np.nan_to_num(x, nan=0.0, posinf=1.0, neginf=-1.0)
    else:
        raise WavError(f"unsupported WAV encoding (format tag {tag:#x}); use PCM or IEEE float")
    return x.reshape(-1, channels)


def read_wav(path: str | Path) -> tuple[Float32Array, int]:
    """``(samples, rate)``: float32 ``(frames, channels)`` in [-1, 1] (float files are not clipped)."""
    blob = Path(path).read_bytes()
    if len(blob) < 12 or blob[:4] not in (b"RIFF", b"RF64") or blob[8:12] != b"WAVE":
        raise WavError(f"{path}: not a RIFF/WAVE file")
    fmt: tuple[int, int, int, int] | None = None  # tag, channels, rate, bits
    data: bytes | None = None
    pos = 12
    while pos + 8 <= len(blob):
        cid, size = blob[pos : pos + 4], struct.unpack_from("<I", blob, pos + 4)[0]
        body = blob[pos + 8 : pos + 8 + size]
        if cid == b"fmt ":
            if len(body) < 16:
                raise WavError(f"{path}: truncated fmt chunk")
            tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", body)
            if tag == _EXTENSIBLE and len(body) >= 26:
                tag = struct.unpack_from("<H", body, 24)[0]  # first two bytes of the sub-format GUID
            fmt = (tag, channels, rate, bits)
        elif cid == b"data":
            # A streamed WAV may carry a bogus size (0 or 0xFFFFFFFF): take what is there.
            data = blob[pos + 8 :] if size in (0, 0xFFFFFFFF) else body
            if size in (0, 0xFFFFFFFF):
                break
        pos += 8 + size + (size & 1)
    if fmt is None or data is None:
        raise WavError(f"{path}: no {'fmt' if fmt is None else 'data'} chunk")
    tag, channels, rate, bits = fmt
    if channels < 1 or rate < 1 or bits % 8:
        raise WavError(f"{path}: bad format ({channels} channels, {rate} Hz, {bits} bits)")
    return _decode_samples(data, tag, bits, channels), rate


def to_mono(samples: npt.NDArray[np.floating]) -> Float32Array:
    """Average the channels of a ``(frames, channels)`` array (a 1-D array is returned as is)."""
    x = np.asarray(samples, dtype=np.float32)
    if x.ndim == 1:
        return x
    return x.mean(axis=1, dtype=np.float32) if x.shape[1] > 1 else x[:, 0].copy()


def resample(samples: npt.NDArray[np.floating], src_rate: int, dst_rate: int = SAMPLE_RATE) -> Float32Array:
    """Band-limited resampling of a whole mono signal from ``src_rate`` to ``dst_rate`` (soxr, HQ:
    the library the server resamples with); ``len(x) * dst_rate // src_rate`` samples out."""
    x = np.asarray(samples, dtype=np.float32)
    if src_rate == dst_rate or x.size == 0:
        return x.copy()
    out: Float32Array = np.asarray(soxr.resample(x, src_rate, dst_rate, quality=QUALITY), dtype=np.float32)
    return out


def to_model_input(samples: npt.NDArray[np.floating], rate: int) -> Float32Array:
    """Mono float32 at 24 kHz, what the server takes."""
    return resample(to_mono(samples), rate, SAMPLE_RATE)


def pcm16_to_float(data: bytes) -> Float32Array:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def pad_to_frames(samples: Float32Array, frame_samples: int = FRAME_SAMPLES) -> Float32Array:
    """Zero-pad to a whole number of frames (the last partial frame is kept, not dropped)."""
    rest = (-samples.size) % frame_samples
    return np.concatenate([samples, np.zeros(rest, np.float32)]) if rest else samples


def write_wav(path: str | Path, pcm16: bytes, rate: int = SAMPLE_RATE) -> None:
    """Write mono 16-bit PCM."""
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm16)


def rms(samples: npt.NDArray[np.floating]) -> float:
    x = np.asarray(samples, dtype=np.float64)
    return float(np.sqrt(np.mean(x * x))) if x.size else 0.0


def speech_like(
    seconds: float, *, seed: int = 0, rate: int = SAMPLE_RATE, level: float = 0.3
) -> Float32Array:
    """Deterministic speech-like audio: syllables (~4 Hz) of voiced harmonics whose pitch glides
    around 90-220 Hz, with short pauses between phrases and a little breath noise."""
    rng = np.random.default_rng(seed)
    n = round(seconds * rate)
    t = np.arange(n) / rate
    f0 = 150 + 55 * np.sin(2 * np.pi * 0.37 * t + rng.uniform(0, 6.3)) + 15 * np.sin(2 * np.pi * 2.1 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    voiced = sum((0.9**k) * np.sin(k * phase) for k in range(1, 9))
    syllable = np.clip(np.sin(2 * np.pi * 4.0 * t + rng.uniform(0, 6.3)), 0, None) ** 0.6
    phrase = (np.sin(2 * np.pi * 0.25 * t + rng.uniform(0, 6.3)) > -0.6).astype(np.float64)
    noise = rng.standard_normal(n) * 0.02
    x = level * 0.35 * voiced * syllable * phrase + noise
    return np.clip(x, -1.0, 1.0).astype(np.float32)


# -- input audio as wire messages ---------------------------------------------------------------
# The append message is the hot path: build its text around the base64 once, from the encoder.
_APPEND_HEAD, _APPEND_TAIL = dumps(
    {k: v for k, v in encode_client_event(InputAudioBufferAppend(audio="\x00")).items() if v is not None}
).split("\\u0000")


def append_message(audio: bytes, pad_ms: int | None = None) -> str:
    """``input_audio_buffer.append`` JSON text carrying ``audio`` (already in the session format);
    ``pad_ms`` (alignment, docs/protocol.md §7): the server inserts that much silence before
    this append's audio."""
    text = _APPEND_HEAD + base64.b64encode(audio).decode("ascii") + _APPEND_TAIL
    if pad_ms is None:
        return text
    return text[:-1] + f',"pad_ms":{int(pad_ms)}}}'


# -- formats ------------------------------------------------------------------------------------
INPUT_FORMAT_HELP: Final = (
    f"pcm16[@RATE] or pcm_f32le[@RATE] with RATE one of {', '.join(map(str, INPUT_RATES))} "
    f"(default {SAMPLE_RATE}); pcmu/g711_ulaw or pcma/g711_alaw (@{G711_RATE} only)"
)
OUTPUT_FORMAT_HELP: Final = f"pcm16 (@{SAMPLE_RATE}) or pcmu/g711_ulaw, pcma/g711_alaw (@{G711_RATE})"


@attrs.frozen
class WireFormat:
    """A session audio format: canonical name (``pcm16``, ``pcm_f32le``, ``g711_ulaw``,
    ``g711_alaw``) and sample rate."""

    name: str
    rate: int

    @property
    def width(self) -> int:
        """Bytes per sample."""
        return FORMATS[self.name]

    @property
    def frame_samples(self) -> int:
        """Samples in one 80 ms frame at this rate (1920 at 24 kHz, 640 at 8 kHz)."""
        return self.rate * FRAME_MS // 1000

    @property
    def frame_bytes(self) -> int:
        return self.frame_samples * self.width

    def __str__(self) -> str:
        return f"{self.name}@{self.rate}"


def _split(spec: str) -> tuple[str, int | None]:
    name, sep, rate = spec.strip().partition("@")
    if not sep:
        return name, None
    try:
        return name, int(rate)
    except ValueError:
        raise AudioError(
            error_codes.UNSUPPORTED_AUDIO_FORMAT, f"bad sample rate {rate!r} in {spec!r}"
        ) from None


def parse_input_format(spec: str) -> WireFormat:
    """``pcm16`` (= pcm16@24000), ``pcm16@48000``, ``pcm_f32le@16000``, ``pcmu``/``g711_ulaw``,
    ``pcma``/``g711_alaw`` (@8000), or any alias the server takes (``audio/pcm``...); raises
    AudioError (unsupported_audio_format, naming what is supported) otherwise."""
    try:
        name, rate = _split(spec)
        fmt = canonical_format(name)
        return WireFormat(fmt, check_rate(fmt, default_rate(fmt) if rate is None else rate))
    except AudioError as exc:
        raise AudioError(
            exc.code, f"unsupported input format {spec!r}; supported: {INPUT_FORMAT_HELP}"
        ) from None


def parse_output_format(spec: str) -> WireFormat:
    """``pcm16`` (@24000) or G.711 (``pcmu``/``g711_ulaw``, ``pcma``/``g711_alaw``, @8000)."""
    try:
        name, rate = _split(spec)
        fmt = canonical_output_format(name)
    except AudioError:
        fmt, rate = "", None
    if not fmt or (rate is not None and rate != OUTPUT_FORMATS[fmt]):
        raise AudioError(
            error_codes.UNSUPPORTED_AUDIO_FORMAT,
            f"unsupported output format {spec!r}; supported: {OUTPUT_FORMAT_HELP}",
        )
    return WireFormat(fmt, OUTPUT_FORMATS[fmt])


def to_wire_bytes(samples: AudioInput, input_format: str = "pcm16") -> bytes:
    """Audio as the bytes of ``input_format``, at the samples' own rate. Bytes pass through
    unchanged (they must already be in that format); int16 arrays are PCM16; float arrays are
    samples in [-1, 1]. G.711 is encoded from the PCM16 rounding of the samples."""
    if isinstance(samples, bytes | bytearray | memoryview):
        return bytes(samples)
    x = np.asarray(samples)
    if x.ndim != 1:
        raise ValueError(f"expected mono samples (a 1-D array), got shape {x.shape}")
    fmt = canonical_format(input_format)
    if x.dtype == np.int16:
        if fmt == "pcm16":
            return x.astype("<i2", copy=False).tobytes()
        if fmt == "pcm_f32le":
            return (x.astype(np.float32) / 32768.0).astype("<f4").tobytes()
        return encode_g711(x.astype("<i2", copy=False).tobytes(), fmt)
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"samples must be int16 or float, not {x.dtype}")
    if fmt == "pcm16":
        return float_to_pcm16(x)
    if fmt == "pcm_f32le":
        return np.ascontiguousarray(x, dtype="<f4").tobytes()
    return encode_g711(float_to_pcm16(x), fmt)


@attrs.frozen
class EncodedAudio:
    """Audio pre-encoded as ``input_audio_buffer.append`` messages, one per chunk of
    ``chunk_samples`` (default one 80 ms frame; the last may be shorter). Encode once and stream
    it many times (``duplex-load`` shares one between all its sessions). ``data``: the wire bytes
    of the whole stream, from which a client that follows an alignment hint cuts its chunks anew.

    ``ready_frames[i]``: the whole 24 kHz model frames the server can have after message ``i``
    (computed with the server's own resampler). Equal to ``i + 1`` at 24 kHz; at any other rate
    the resampler's delay holds back a little of each frame, so frame k is only complete once
    message k + 1 arrives and the last frame waits for audio that never comes."""

    messages: tuple[str, ...]
    total_samples: int
    input_format: str
    sample_rate_hz: int = SAMPLE_RATE
    ready_frames: tuple[int, ...] | None = None
    chunk_samples: int | None = None  # None: one 80 ms frame
    data: bytes = attrs.field(default=b"", repr=False)

    @property
    def frames(self) -> int:
        """Messages (one per 80 ms frame unless ``chunk_samples`` says otherwise)."""
        return len(self.messages)

    @property
    def chunk(self) -> int:
        """Samples per message (at ``sample_rate_hz``)."""
        return self.frame_samples if self.chunk_samples is None else self.chunk_samples

    @property
    def frame_samples(self) -> int:
        return self.sample_rate_hz * FRAME_MS // 1000

    @property
    def seconds(self) -> float:
        return self.total_samples / self.sample_rate_hz

    @property
    def expected_frames(self) -> int:
        """Output frames the whole stream can bring back (one per whole model frame)."""
        if self.ready_frames is None:
            return self.total_samples * SAMPLE_RATE // self.sample_rate_hz // FRAME_SAMPLES
        return self.ready_frames[-1] if self.ready_frames else 0


def ready_frames(chunks: list[bytes], fmt: str, rate: int) -> tuple[int, ...]:
    """For each chunk, the whole 24 kHz frames the server's :class:`InputStream` holds after it."""
    stream = InputStream()
    total, out = 0, []
    for chunk in chunks:
        total += len(stream.feed(chunk, fmt, rate))
        out.append(total // FRAME_SAMPLES)
    return tuple(out)


def encode_audio(
    samples: AudioInput,
    input_format: str = "pcm16",
    frame_samples: int | None = None,
    *,
    sample_rate_hz: int | None = None,
) -> EncodedAudio:
    """``samples`` (at ``sample_rate_hz``: the format's default rate unless given) as append
    messages of one 80 ms frame each (``frame_samples`` to override)."""
    fmt = canonical_format(input_format)
    rate = check_rate(fmt, default_rate(fmt) if sample_rate_hz is None else sample_rate_hz)
    data = to_wire_bytes(samples, fmt)
    width = FORMATS[fmt]
    step = (rate * FRAME_MS // 1000 if frame_samples is None else frame_samples) * width
    chunks = [data[i : i + step] for i in range(0, len(data), step)]
    messages = tuple(append_message(c) for c in chunks)
    return EncodedAudio(
        messages, len(data) // width, fmt, rate, ready_frames(chunks, fmt, rate), step // width, data
    )
