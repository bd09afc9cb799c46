"""Input formats and rates in the session core (docs/protocol.md §3): G.711 and 8-48 kHz in, resampled to
24 kHz by one soxr stream per session, split-invariant and replay-exact; G.711 out."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex_actors import audio
from duplex_actors.audio import FRAME_SAMPLES, OutputStream, encode_f32, float_to_pcm16
from duplex_actors.log import records as r
from duplex_actors.model.family import detect_family
from duplex_actors.session import events as ev
from duplex_actors.session.core import Emit, SessionCore, SubmitFrame

SID = "sess_0123456789abcdef01234567"


def new_core() -> SessionCore:
    core = SessionCore(SID, detect_family(["NATF2.pt", "NATM1.pt"]))
    core.apply(r.Open({}))
    return core


def tone(rate: int, seconds: float, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def encoded(samples: np.ndarray, fmt: str) -> bytes:
    pcm16 = float_to_pcm16(samples)
    if fmt == "pcm16":
        return pcm16
    if fmt == "pcm_f32le":
        return encode_f32(samples)
    return audio.encode_g711(pcm16, fmt)


def model_input(records: Sequence[r.Record]) -> np.ndarray:
    core = new_core()
    frames = [e.samples for rec in records for e in core.apply(rec) if isinstance(e, SubmitFrame)]
    return np.concatenate(frames) if frames else np.zeros(0, np.float32)


def split(data: bytes, width: int, cuts: list[int]) -> list[bytes]:
    n = len(data) // width
    points = sorted({min(c, n) for c in cuts} | {0, n})
    return [data[a * width : b * width] for a, b in itertools.pairwise(points) if b > a]


CASES = [("pcm16", 48000), ("pcm16", 44100), ("pcm_f32le", 16000), ("pcm16", 22050), ("g711_ulaw", 8000)]


@pytest.mark.parametrize(("fmt", "rate"), CASES)
def test_resampled_input_is_the_tone_at_24k(fmt: str, rate: int) -> None:
    data = encoded(tone(rate, 1.0), fmt)
    out = model_input([r.Append(data, fmt, None, rate)])
    # A second in gives about a second out (less soxr's delay), as whole frames.
    assert 20 * FRAME_SAMPLES >= len(out) >= 11 * FRAME_SAMPLES
    spectrum = np.abs(np.fft.rfft(out[FRAME_SAMPLES : 11 * FRAME_SAMPLES]))
    peak_hz = np.argmax(spectrum) * audio.SAMPLE_RATE / (10 * FRAME_SAMPLES)
    assert abs(peak_hz - 440) < 5
    assert 0.3 < float(np.sqrt(np.mean(out[FRAME_SAMPLES:] ** 2))) < 0.4  # 0.5 / sqrt(2)


@settings(max_examples=25, deadline=None)
@given(
    case=st.sampled_from(CASES),
    cuts=st.lists(st.integers(min_value=1, max_value=20000), max_size=12),
)
def test_any_split_of_a_stream_gives_the_same_model_input(case: tuple[str, int], cuts: list[int]) -> None:
    fmt, rate = case
    data = encoded(tone(rate, 0.5, 300.0) + tone(rate, 0.5, 1234.0) * 0.3, fmt)
    width = audio.FORMATS[fmt]
    whole = model_input([r.Append(data, fmt, None, rate)])
    pieces = model_input([r.Append(p, fmt, None, rate) for p in split(data, width, cuts)])
    assert len(whole) > 0
    np.testing.assert_array_equal(pieces, whole)


def test_10ms_browser_chunks_at_48k_equal_the_whole_and_replay_exactly() -> None:
    data = encoded(tone(48000, 2.0), "pcm16")
    chunks = [r.Append(data[i : i + 960], "pcm16", None, 48000) for i in range(0, len(data), 960)]
    first = model_input(chunks)
    assert len(first) >= 23 * FRAME_SAMPLES
    np.testing.assert_array_equal(first, model_input(chunks))  # a replay rebuilds the same state
    np.testing.assert_array_equal(first, model_input([r.Append(data, "pcm16", None, 48000)]))
    # Through the log's payload encoding too (what duplex-replay reads back).
    decoded = [r.decode_payload(*r.encode_payload(c)) for c in chunks]
    assert decoded == chunks
    np.testing.assert_array_equal(first, model_input(decoded))


def test_a_version_1_append_reads_as_24k() -> None:
    rec = r.Append(b"\x00\x01" * 4, "pcm16", "e1")
    kind, _ = r.encode_payload(rec)
    text = b'{"client_event_id":"e1","format":"pcm16"}'  # a version-1 append: no rate
    old = len(text).to_bytes(4, "little") + text + rec.audio
    assert r.decode_payload(kind, old) == rec


@pytest.mark.parametrize(
    ("rec", "code"),
    [
        (r.Append(b"\x00" * 961, "pcm16", "bad", 48000), "bad_audio"),
        (r.Append(b"\x00" * 6, "pcm_f32le", "bad", 16000), "bad_audio"),
        (r.Append(b"\x00" * 80, "g711_ulaw", "bad", 16000), "unsupported_audio_format"),
        (r.Append(b"\x00" * 80, "opus", "bad", 48000), "unsupported_audio_format"),
    ],
)
def test_bad_input_is_an_error_and_the_session_goes_on(rec: r.Append, code: str) -> None:
    core = new_core()
    core.apply(r.Append(encoded(tone(48000, 0.05), "pcm16"), "pcm16", None, 48000))
    (err,) = [e.event for e in core.apply(rec) if isinstance(e, Emit)]
    assert isinstance(err, ev.Error) and err.code == code and err.client_event_id == "bad"
    if code == "unsupported_audio_format":
        assert "g711_ulaw" in err.message and "48000" in err.message
    more = core.apply(r.Append(encoded(tone(48000, 0.2), "pcm16"), "pcm16", None, 48000))
    assert any(isinstance(e, SubmitFrame) for e in more)


def test_g711_tables_round_trip_and_match_the_reference_points() -> None:
    assert list(audio.ULAW_TO_PCM16[[0x00, 0x80, 0xFF]]) == [-32124, 32124, 0]
    assert list(audio.ALAW_TO_PCM16[[0xD5, 0x55, 0xAA, 0x2A]]) == [8, -8, 32256, -32256]
    for fmt in ("g711_ulaw", "g711_alaw"):
        codes = bytes(range(256))
        pcm = float_to_pcm16(audio.decode(codes, fmt))
        back = audio.encode_g711(pcm, fmt)
        # mu-law has two zeros (0x7F, 0xFF); every other code is its own quantisation.
        assert sum(a != b for a, b in zip(back, codes, strict=True)) <= (1 if fmt == "g711_ulaw" else 0)


@pytest.mark.parametrize("fmt", ["g711_ulaw", "g711_alaw"])
def test_g711_output_is_whole_640_byte_frames_at_8k(fmt: str) -> None:
    out = OutputStream(fmt)
    assert out.rate == 8000
    pcm = float_to_pcm16(tone(24000, 2.0, 500.0))
    sent = [out.encode(pcm[i : i + 3840]) for i in range(0, len(pcm), 3840)]
    assert all(len(f) == 640 for f in sent)
    decoded = np.concatenate([audio.decode(f, fmt) for f in sent[3:]])
    assert 0.3 < float(np.sqrt(np.mean(decoded**2))) < 0.4
    spectrum = np.abs(np.fft.rfft(decoded))
    assert abs(np.argmax(spectrum) * 8000 / len(decoded) - 500) < 5
    assert out.padded_samples < 640  # only the first frames are completed with silence


def test_realtime_projection_sends_g711_deltas_when_the_session_asks() -> None:
    import base64

    from duplex_actors.protocol.realtime import RealtimeProjection
    from duplex_actors.protocol.session_config import normalize_session_config

    config = normalize_session_config({"audio": {"output": {"format": {"type": "audio/pcmu"}}}})
    assert config["output_audio_format"] == "g711_ulaw"
    proj = RealtimeProjection(SID, "tiny-parrot", {})
    proj.project(ev.SessionCreated(SID, config))
    pcm = float_to_pcm16(tone(24000, 0.08 * 5, 500.0))
    deltas = []
    for k in range(5):
        frame = ev.AudioFrame("resp_1", "item_1", 0, k, pcm[k * 3840 : (k + 1) * 3840], "")
        deltas += [m for m in proj.project(frame) if m["type"] == "response.output_audio.delta"]
    assert len(deltas) == 5
    for d in deltas:
        assert d["format"] == "g711_ulaw" and d["sample_rate_hz"] == 8000
        assert len(base64.b64decode(d["delta"])) == 640
    pcm_proj = RealtimeProjection(SID, "tiny-parrot", {})
    pcm_proj.project(ev.SessionCreated(SID, {}))
    (d,) = pcm_proj.project(ev.AudioFrame("resp_1", "item_1", 0, 0, pcm[:3840], ""))
    assert (
        d["format"] == "pcm16" and d["sample_rate_hz"] == 24000 and base64.b64decode(d["delta"]) == pcm[:3840]
    )
