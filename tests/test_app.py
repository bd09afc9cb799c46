"""``duplex-actors serve`` as a user starts it: a real process on a real port."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from duplex_actors.replay.replayer import replay_logic


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_serve_reaches_ready_with_a_warm_up_session_and_stops_on_sigterm(tmp_path, tiny_dir):
    port = free_port()
    exe = str(Path(sys.executable).with_name("duplex-actors"))
    proc = subprocess.Popen(
        [exe, "serve", "--port", str(port), "--log-dir", str(tmp_path / "logs"), "--max-sessions", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        status: int = 0
        body: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                status, body = get(f"http://127.0.0.1:{port}/ready")
            except OSError:
                status = 0
            if status == 200:
                break
            assert status in (0, 503), (status, body)
            time.sleep(0.3)
        assert status == 200, body
        assert (
            body["ready"]
            and body["slots_total"] == 2
            and body["slots_free"] == 2
            and body["family"] == "personaplex"
        )
        assert get(f"http://127.0.0.1:{port}/health") == (200, {"status": "healthy"})
        status, models = get(f"http://127.0.0.1:{port}/v1/models")
        assert status == 200 and models["data"][0]["id"] == "tiny"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    (log,) = (tmp_path / "logs").glob("*.dlog")
    report = replay_logic(log)
    assert report.complete and report.identical and report.frames_out == 3
