"""WAV reading in every common encoding, downmix, resampling to 24 kHz, PCM16 conversion."""

from __future__ import annotations

import base64
import json
import struct
import wave
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from duplex_actors.audio import FRAME_SAMPLES, AudioError, decode, encode_g711, float_to_pcm16
from duplex_actors.client.audio import (
    WavError,
    WireFormat,
    encode_audio,
    pad_to_frames,
    parse_input_format,
    parse_output_format,
    pcm16_to_float,
    read_wav,
    resample,
    speech_like,
    to_model_input,
    to_wire_bytes,
    write_wav,
)


def _riff(
    path: Path, data: bytes, *, tag: int, channels: int, rate: int, bits: int, extensible: bool = False
) -> None:
    block = channels * bits // 8
    if extensible:
        guid = struct.pack("<H", tag) + b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
        fmt = struct.pack("<HHIIHHHHI", 0xFFFE, channels, rate, rate * block, block, bits, 22, bits, 0) + guid
    else:
        fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * block, block, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"LIST" + struct.pack("<I", 4) + b"INFO"  # an extra chunk the reader must skip
    body += b"data" + struct.pack("<I", len(data)) + data
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)


def _tone(n: int, freq: float, rate: int) -> npt.NDArray[np.float32]:
    return (0.5 * np.sin(2 * np.pi * freq * np.arange(n) / rate)).astype(np.float32)


def test_pcm16_stereo_roundtrip(tmp_path: Path) -> None:
    x = np.stack([_tone(800, 440, 16_000), _tone(800, 880, 16_000)], axis=1)
    path = tmp_path / "s.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(16_000)
        w.writeframes(float_to_pcm16(x.reshape(-1)))
    samples, rate = read_wav(path)
    assert rate == 16_000 and samples.shape == (800, 2)
    np.testing.assert_allclose(samples, x, atol=1 / 32768 + 1e-6)


@pytest.mark.parametrize(
    ("tag", "bits", "extensible"),
    [
        (1, 8, False),
        (1, 24, False),
        (1, 32, False),
        (3, 32, False),
        (3, 64, False),
        (3, 32, True),
        (1, 24, True),
    ],
)
def test_encodings(tmp_path: Path, tag: int, bits: int, extensible: bool) -> None:
    x = _tone(480, 300, 48_000)
    if tag == 3:
        data = x.astype("<f4" if bits == 32 else "<f8").tobytes()
    elif bits == 8:
        data = (np.round(x * 127) + 128).astype(np.uint8).tobytes()
    elif bits == 24:
        ints = np.round(x * (2**23 - 1)).astype("<i4")
        data = b"".join(int(v).to_bytes(3, "little", signed=True) for v in ints)
    else:
        data = np.round(x * (2**31 - 1)).astype("<i4").tobytes()
    path = tmp_path / "e.wav"
    _riff(path, data, tag=tag, channels=1, rate=48_000, bits=bits, extensible=extensible)
    samples, rate = read_wav(path)
    assert rate == 48_000 and samples.shape == (480, 1)
    np.testing.assert_allclose(samples[:, 0], x, atol=1 / 100 if bits == 8 else 1e-4)


def test_not_a_wav(tmp_path: Path) -> None:
    path = tmp_path / "x.wav"
    path.write_bytes(b"hello world, not a wav")
    with pytest.raises(WavError):
        read_wav(path)
    _riff(path, b"\x00" * 8, tag=0x55, channels=1, rate=8000, bits=16)  # MP3-in-WAV
    with pytest.raises(WavError, match="format tag"):
        read_wav(path)


@pytest.mark.parametrize("src", [8_000, 16_000, 22_050, 44_100, 48_000])
def test_resample_keeps_a_tone(src: int) -> None:
    x = _tone(src, 1000, src)  # one second
    y = resample(x, src, 24_000)
    assert y.size == 24_000
    ref = _tone(24_000, 1000, 24_000)
    np.testing.assert_allclose(y[500:-500], ref[500:-500], atol=2e-3)


def test_resample_removes_what_24k_cannot_carry() -> None:
    x = _tone(48_000, 15_000, 48_000)  # above the 12 kHz Nyquist of 24 kHz
    y = resample(x, 48_000, 24_000)
    assert np.sqrt(np.mean(y[500:-500] ** 2)) < 0.02


def test_to_model_input_downmixes_and_resamples() -> None:
    left = _tone(16_000, 500, 16_000)
    stereo = np.stack([left, -left], axis=1)  # cancels out when averaged
    mono = to_model_input(stereo, 16_000)
    assert mono.dtype == np.float32 and mono.shape == (24_000,)
    assert np.abs(mono).max() < 1e-6


def test_pcm16_helpers_and_padding(tmp_path: Path) -> None:
    x = np.array([-1.5, -1.0, 0.0, 0.5, 1.0, 2.0], np.float32)
    pcm = float_to_pcm16(x)
    assert np.frombuffer(pcm, "<i2").tolist() == [-32768, -32768, 0, 16384, 32767, 32767]
    assert pcm16_to_float(pcm)[3] == 0.5
    assert pad_to_frames(np.ones(FRAME_SAMPLES + 1, np.float32)).size == 2 * FRAME_SAMPLES
    assert pad_to_frames(np.ones(FRAME_SAMPLES, np.float32)).size == FRAME_SAMPLES
    write_wav(tmp_path / "o.wav", pcm)
    samples, rate = read_wav(tmp_path / "o.wav")
    assert rate == 24_000 and samples.shape == (6, 1)


def test_speech_like_is_deterministic_and_audible() -> None:
    a, b = speech_like(1.0, seed=1), speech_like(1.0, seed=1)
    assert a.dtype == np.float32 and a.size == 24_000
    np.testing.assert_array_equal(a, b)
    assert 0.02 < float(np.sqrt(np.mean(a**2))) < 0.5


def test_format_specs() -> None:
    assert parse_input_format("pcm16") == WireFormat("pcm16", 24_000)
    assert parse_input_format("pcm16@48000") == WireFormat("pcm16", 48_000)
    assert parse_input_format("pcm_f32le@16000").frame_bytes == 1280 * 4
    assert parse_input_format("pcmu") == parse_input_format("g711_ulaw@8000") == WireFormat("g711_ulaw", 8000)
    assert parse_input_format("pcma").frame_bytes == 640
    assert parse_input_format("pcm16@8000").frame_bytes == 1280
    assert parse_output_format("pcmu") == WireFormat("g711_ulaw", 8000)
    assert parse_output_format("pcm16@24000") == WireFormat("pcm16", 24_000)
    for bad in ("pcmu@16000", "pcm16@11025", "opus", "pcm16@fast"):
        with pytest.raises(AudioError, match="supported: pcm16"):
            parse_input_format(bad)
    for bad in ("pcm_f32le", "pcm16@48000", "pcma@16000"):
        with pytest.raises(AudioError, match="supported: pcm16"):
            parse_output_format(bad)


def test_g711_encoding_and_ready_frames() -> None:
    x = speech_like(1.0, rate=8000, seed=1)
    enc = encode_audio(x, "pcmu")
    assert enc.sample_rate_hz == 8000 and enc.frames == 13 and enc.frame_samples == 640
    assert enc.seconds == 1.0
    data = b"".join(base64.b64decode(json.loads(m)["audio"]) for m in enc.messages)
    assert len(data) == 8000 and data == to_wire_bytes(x, "g711_ulaw")
    # the codes decode back to the samples within G.711's quantisation error
    back = decode(data, "g711_ulaw")
    assert np.max(np.abs(back - x)) < 0.02
    assert to_wire_bytes(np.array([0, 1000, -1000], np.int16), "pcma") == encode_g711(
        np.array([0, 1000, -1000], "<i2").tobytes(), "g711_alaw"
    )
    # the server's resampler delay: frame k is complete only after message k + 1
    assert enc.ready_frames is not None and enc.ready_frames[:3] == (0, 1, 2)
    assert enc.expected_frames == 12
    at24 = encode_audio(speech_like(1.04, seed=1), "pcm16")
    assert at24.ready_frames == tuple(range(1, 14)) and at24.expected_frames == 13
