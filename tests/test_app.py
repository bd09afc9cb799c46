"""``duplex-actors serve`` as a user starts it: a real process on a real port; and the app
module's entries (lazy ``app``, the ``create_app()`` factory, bad ``DUPLEX_*`` values)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, cast

import pytest


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


def test_serve_reaches_ready_after_the_engines_warm_up_and_stops_on_sigterm(tmp_path, tiny_dir):
    port = free_port()
    exe = str(Path(sys.executable).with_name("duplex-actors"))
    proc = subprocess.Popen(
        [exe, "serve", "--port", str(port), "--log-dir", str(tmp_path / "logs"), "--max-sessions", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # A flag wins over its variable: the bad DUPLEX_MAX_SESSIONS is never read.
        env={**os.environ, "DUPLEX_MAX_SESSIONS": "abc"},
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
    # The warm-up is the engine core's (a prompt prefilled, three steps): no session, no log.
    assert body["warmup_ms"] > 0
    assert list((tmp_path / "logs").glob("*.dlog")) == []


@pytest.mark.parametrize("entry", ["duplex_actors.app:app", "duplex_actors.app:create_app()"])
def test_a_bad_duplex_variable_stops_hypercorn_with_one_line_naming_it(tmp_path, entry):
    exe = str(Path(sys.executable).with_name("hypercorn"))
    proc = subprocess.run(
        [exe, "-k", "trio", "--bind", f"127.0.0.1:{free_port()}", entry],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "DUPLEX_MAX_SESSIONS": "abc"},
        timeout=60,
    )
    out = proc.stdout + proc.stderr
    assert out.strip().splitlines() == ["duplex-actors: DUPLEX_MAX_SESSIONS='abc': expected an integer"], out


def test_importing_the_app_module_reads_no_variable_and_patches_nothing():
    script = """
import os
from hypercorn.protocol import ws_stream
from hypercorn.trio import tcp_server
originals = (ws_stream.Handshake.__init__, ws_stream.WSStream._handle_events, tcp_server.TCPServer.run)
patched = lambda: (ws_stream.Handshake.__init__, ws_stream.WSStream._handle_events, tcp_server.TCPServer.run)

import duplex_actors.app as module  # DUPLEX_MAX_SESSIONS=abc: reading it would raise

assert patched() == originals, "hypercorn patched at import"
assert not module.app.loaded
os.environ["DUPLEX_MAX_SESSIONS"] = "3"
guarded = module.app.load()  # what hypercorn's first ASGI call does
assert isinstance(guarded, module.DuplexApp) and guarded.holder.config.max_sessions == 3
assert all(now is not before for now, before in zip(patched(), originals)), "not patched on first use"
print("ok")
"""
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "DUPLEX_MAX_SESSIONS": "abc"},
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


def test_hypercorns_factory_form_gives_the_guarded_app(tmp_path, monkeypatch):
    from hypercorn.utils import load_application

    from duplex_actors.app import DuplexApp, LazyApp
    from duplex_actors.web.hardening import GuardedApp

    monkeypatch.setenv("DUPLEX_LOG_DIR", str(tmp_path))
    monkeypatch.setenv("DUPLEX_MAX_SESSIONS", "3")
    factory = cast(Any, load_application("duplex_actors.app:create_app()", 0)).app
    assert isinstance(factory, DuplexApp) and isinstance(factory, GuardedApp)
    assert factory.holder.config.max_sessions == 3
    lazy = cast(Any, load_application("duplex_actors.app:app", 0)).app
    assert isinstance(lazy, LazyApp) and isinstance(lazy.load(), DuplexApp)
