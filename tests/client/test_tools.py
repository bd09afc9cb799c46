"""The console scripts end to end against a real server: ``duplex-client`` with a spoken WAV
(espeak-ng + sox, see the ``speech_wav`` fixture) and ``duplex-load`` with two sessions."""

from __future__ import annotations

import json
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
import trio

from duplex_actors.audio import FRAME_SAMPLES
from duplex_actors.client import open_duplex_client
from duplex_actors.client.audio import read_wav, rms
from tests.e2e.conftest import ServerProcess
from tests.e2e.helpers import wait_idle

from .conftest import API_KEY

BIN = Path(sys.executable).parent
CLIENT = str(BIN / "duplex-client")
LOAD = str(BIN / "duplex-load")


def _expected_frames(wav: Path, tail_ms: float = 240.0) -> int:
    with wave.open(str(wav)) as w:
        n, rate = int(w.getnframes()), int(w.getframerate())
    at_24k = n * 24_000 // rate  # the resampler's output length for an integer ratio
    return -(-(at_24k + round(tail_ms * 24)) // FRAME_SAMPLES)  # ceil


def test_duplex_client_speech_wav(server: ServerProcess, speech_wav: Path, tmp_path: Path) -> None:
    """A spoken sentence (or, where espeak-ng/sox cannot be installed, synthetic speech-like
    audio) at 16 kHz stereo in; the parrot's reply out: one 80 ms frame per input frame, and
    audible, since the parrot echoes the codes of what it hears."""
    wav = speech_wav
    out, text = tmp_path / "reply.wav", tmp_path / "reply.txt"
    proc = subprocess.run(
        [
            CLIENT,
            "--url",
            f"{server.ws}/v1/realtime?duplex=1",
            "--input",
            str(wav),
            "--output",
            str(out),
            "--transcript",
            str(text),
            "--voice",
            "NATF2.pt",
            "--persona",
            "You repeat what you hear.",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "sent" in proc.stderr and "wrote" in proc.stderr  # progress and summary on stderr
    reply, rate = read_wav(out)
    assert rate == 24_000 and reply.shape[1] == 1
    frames = _expected_frames(wav)
    assert reply.shape[0] == frames * FRAME_SAMPLES, (reply.shape, frames)
    assert rms(reply[:, 0]) > 1e-3, "the parrot's reply is silent"
    assert text.exists()


def test_duplex_client_fast_and_exit_codes(
    server: ServerProcess,
    locked_server: ServerProcess,
    speech_wav: Path,
    tmp_path: Path,
) -> None:
    wav = speech_wav
    out = tmp_path / "fast.wav"
    url = f"{server.ws}/v1/realtime?duplex=1"
    fast = subprocess.run(
        [CLIENT, "--url", url, "--input", str(wav), "--output", str(out), "--fast", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert fast.returncode == 0, fast.stderr
    assert read_wav(out)[0].shape[0] == _expected_frames(wav) * FRAME_SAMPLES

    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not a wav at all")
    run = subprocess.run(
        [CLIENT, "--url", url, "-i", str(bad), "-o", str(out)], capture_output=True, text=True
    )
    assert run.returncode == 2 and "cannot read" in run.stderr

    locked_url = f"{locked_server.ws}/v1/realtime?duplex=1"
    run = subprocess.run(
        [CLIENT, "--url", locked_url, "-i", str(wav), "-o", str(out), "--api-key", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 3 and "unauthorized" in run.stderr

    async def while_full() -> subprocess.CompletedProcess[bytes]:
        async with open_duplex_client(locked_url, api_key=API_KEY):  # takes the only slot
            return await trio.run_process(
                [CLIENT, "--url", locked_url, "-i", str(wav), "-o", str(out), "--api-key", API_KEY],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )

    full = trio.run(while_full)
    assert full.returncode == 4 and b"full" in full.stderr


def test_duplex_load_two_sessions(server: ServerProcess, tmp_path: Path) -> None:
    trio.run(wait_idle, server)
    out = tmp_path / "load"
    proc = subprocess.run(
        [
            LOAD,
            "--url",
            f"{server.ws}/v1/realtime?duplex=1",
            "--sessions",
            "2",
            "--seconds",
            "3",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "rtt p99" in proc.stdout and "all" in proc.stdout  # the summary table
    report = json.loads((out / "load.json").read_text())
    agg = report["aggregate"]
    for key in (
        "frames_sent",
        "frames_received",
        "coverage",
        "time_to_first_audio_ms",
        "round_trip_ms",
        "packet_interval_ms",
        "underruns",
        "lost_frames",
        "rtf_min",
        "server_deadline_misses",
        "client_cpu_pct",
    ):
        assert key in agg, key
    assert {"p50", "p99", "max"} <= set(agg["round_trip_ms"])
    assert report["n"] == 2 and len(report["sessions"]) == 2
    assert agg["frames_sent"] == 2 * round(3 / 0.08)
    assert agg["coverage"] == 1.0 and agg["lost_frames"] == 0 and agg["failed_sessions"] == 0
    assert agg["server_deadline_misses"] is not None  # read from /metrics
    for s in report["sessions"]:
        assert s["coverage"] == 1.0 and s["lost_frames"] == 0 and s["session_id"].startswith("sess_")
    png = out / "load.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_duplex_load_ramp_report(server: ServerProcess, tmp_path: Path) -> None:
    """The ramp's report shape (whether N held depends on this machine's load, not asserted)."""
    trio.run(wait_idle, server)
    out = tmp_path / "ramp"
    proc = subprocess.run(
        [LOAD, "--url", f"{server.ws}/v1/realtime?duplex=1", "--ramp", "--seconds", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "load.json").read_text())
    assert report["mode"] == "ramp" and 0 <= report["largest_n_held"] <= 2  # capped at the slots
    ns = [t["n"] for t in report["trials"]]
    assert ns[0] == 1 and ns == sorted(ns) and max(ns) <= 2
    assert "largest N that held real time" in proc.stdout
    assert (out / "ramp.png").exists()
    assert np.isfinite(report["trials"][0]["aggregate"]["coverage"])


def _sent_frames(wav: Path, rate: int, tail_ms: float = 240.0) -> int:
    """Whole 80 ms frames ``duplex-client`` sends at ``rate`` (the WAV resampled, the tail added)."""
    with wave.open(str(wav)) as w:
        n, wav_rate = int(w.getnframes()), int(w.getframerate())
    frame = rate * 80 // 1000
    return -(-(n * rate // wav_rate + round(tail_ms * rate / 1000)) // frame)


def test_duplex_client_phone_line_mulaw_in_and_out(
    server: ServerProcess, speech_wav: Path, tmp_path: Path
) -> None:
    """G.711 mu-law at 8 kHz both ways: the reply WAV is the decoded 8 kHz audio, one 80 ms frame
    per frame sent but the last (the server's resampler delay holds back its tail)."""
    wav = speech_wav
    out = tmp_path / "phone.wav"
    url = f"{server.ws}/v1/realtime?duplex=1"
    proc = subprocess.run(
        [
            CLIENT,
            "--url",
            url,
            "-i",
            str(wav),
            "-o",
            str(out),
            "--input-format",
            "pcmu",
            "--output-format",
            "pcmu",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "g711_ulaw@8000" in proc.stderr
    reply, rate = read_wav(out)
    assert rate == 8000 and reply.shape[1] == 1
    sent = _sent_frames(wav, 8000)
    assert reply.shape[0] == (sent - 1) * 640, (reply.shape, sent)
    assert rms(reply[:, 0]) > 1e-3, "the parrot's reply is silent"


def test_duplex_client_browser_rate_48k(server: ServerProcess, speech_wav: Path, tmp_path: Path) -> None:
    wav = speech_wav
    out = tmp_path / "browser.wav"
    url = f"{server.ws}/v1/realtime?duplex=1"
    proc = subprocess.run(
        [CLIENT, "--url", url, "-i", str(wav), "-o", str(out), "--input-format", "pcm16@48000", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    reply, rate = read_wav(out)
    assert rate == 24_000
    sent = _sent_frames(wav, 48_000)
    assert reply.shape[0] == (sent - 1) * FRAME_SAMPLES, (reply.shape, sent)
    assert rms(reply[:, 0]) > 1e-3


def test_bad_format_values_are_argparse_errors(tmp_path: Path) -> None:
    for tool, flag, value, supported in (
        (CLIENT, "--input-format", "pcmu@16000", "pcm16[@RATE]"),
        (CLIENT, "--input-format", "opus", "g711_ulaw"),
        (LOAD, "--input-format", "pcm16@11025", "48000"),
        (LOAD, "--output-format", "pcm_f32le", "pcma"),
    ):
        args = [tool, flag, value] + (
            ["-i", "x.wav", "-o", str(tmp_path / "y.wav")] if tool == CLIENT else []
        )
        proc = subprocess.run(args, capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2, (value, proc.stderr)
        assert f"argument {flag}: unsupported" in proc.stderr and repr(value) in proc.stderr
        assert supported in proc.stderr, proc.stderr


@pytest.mark.serial  # its round-trip median bound is a timing (scripts/run-tests.sh)
def test_duplex_load_phone_line(server: ServerProcess, tmp_path: Path) -> None:
    """Two mu-law sessions: a frame is 80 ms (640 bytes) whatever its size, and the frame the
    resampler holds back at the end is neither lost nor counted against coverage."""
    trio.run(wait_idle, server)
    out = tmp_path / "load"
    proc = subprocess.run(
        [
            LOAD,
            "--url",
            f"{server.ws}/v1/realtime?duplex=1",
            "--sessions",
            "2",
            "--seconds",
            "3",
            "--input-format",
            "pcmu",
            "--output-format",
            "pcmu",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "load.json").read_text())
    assert report["input_format"] == "g711_ulaw@8000" and report["output_format"] == "g711_ulaw@8000"
    agg = report["aggregate"]
    frames = round(3 / 0.08)
    assert agg["frames_sent"] == 2 * frames and agg["frames_expected"] == 2 * (frames - 1)
    assert agg["failed_sessions"] == 0 and agg["error_events"] == 0
    assert agg["coverage"] >= 0.9 and agg["lost_frames"] == 0
    # Round trips are measured from the message that completed each frame: not a frame late.
    assert agg["round_trip_ms"]["p50"] is not None and agg["round_trip_ms"]["p50"] < 80
