"""A real ``duplex-actors serve`` process on a random loopback port, and WebSocket helpers."""

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
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest

EXE = str(Path(sys.executable).with_name("duplex-actors"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


# The servers start_server has started and not yet stopped: a failing test's report shows the
# tail of their output (tests/conftest.py).
LIVE_SERVERS: list[ServerProcess] = []


@attrs.define
class ServerProcess:
    proc: subprocess.Popen[str]
    port: int
    log_dir: Path
    output: str = ""
    # Where the server writes its stdout and stderr (None: to ``proc.stdout``, a pipe read at
    # the end). A file never blocks a server that logs a lot, and can be read while it runs.
    log_path: Path | None = None

    def output_so_far(self) -> str:
        """Everything the server has printed until now."""
        if self.log_path is None:
            return self.output
        return self.log_path.read_text(errors="replace")

    def _collected(self, out: str | None) -> int:
        self.output = self.output_so_far() if self.log_path is not None else self.output + (out or "")
        if self in LIVE_SERVERS:
            LIVE_SERVERS.remove(self)
        return int(self.proc.returncode)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def json(self, path: str) -> tuple[int, dict]:
        status, body = http_get(self.base + path)
        return status, json.loads(body)

    @property
    def frontend_pid(self) -> int:
        """The front-end process serving the connections (the one of ``--frontends 1``, the
        default on this machine's 2 cores); the server's own process is the engine core."""
        pids = [p for p in descendants(self.proc.pid) if b"duplex_actors.frontend" in _cmdline(p)]
        if len(pids) != 1:
            raise AssertionError(f"expected one front end, found {pids}")
        return pids[0]

    @property
    def pids(self) -> list[int]:
        """Every process of the server: the engine core's, its front ends', their workers'."""
        return [self.proc.pid, *descendants(self.proc.pid)]

    def wait(self, timeout: float = 30) -> int:
        """Wait for the process to exit by itself (e.g. after a signal already sent)."""
        out, _ = self.proc.communicate(timeout=timeout)
        return self._collected(out)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return self._collected(out)


def start_server(
    tmp_path: Path,
    *args: str,
    model: str = "tiny-parrot",
    env: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> ServerProcess:
    port = free_port()
    log_dir = tmp_path / "sessions"
    tmp_path.mkdir(parents=True, exist_ok=True)
    log_path = tmp_path / f"server-{port}.out"
    with log_path.open("w") as out:
        proc = subprocess.Popen(
            [EXE, "serve", "--model", model, "--port", str(port), "--log-dir", str(log_dir), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
            preexec_fn=preexec_fn,  # e.g. resource limits for the server only
        )
    server = ServerProcess(proc, port, log_dir, log_path=log_path)
    LIVE_SERVERS.append(server)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            server.stop()
            raise RuntimeError(f"server exited early:\n{server.output}")
        try:
            status, _ = http_get(server.base + "/ready")
        except OSError:
            status = 0
        if status == 200:
            return server
        time.sleep(0.2)
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"server not ready in 90 s:\n{server.output}")


@pytest.fixture(scope="module")
def parrot_server(tmp_path_factory, parrot_dir) -> Iterator[ServerProcess]:
    """``--model tiny-parrot --max-sessions 2``, shared by a test module."""
    server = start_server(tmp_path_factory.mktemp("parrot"), "--max-sessions", "2")
    yield server
    server.stop()


@pytest.fixture
def fresh_server(tmp_path, parrot_dir):
    """Start a server with extra arguments for one test: ``fresh_server("--api-key", "k")``."""
    started: list[ServerProcess] = []

    def start(*args: str, model: str = "tiny-parrot", env: dict[str, str] | None = None) -> ServerProcess:
        server = start_server(tmp_path / f"s{len(started)}", *args, model=model, env=env)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (every thread's children: trio spawns processes from
    worker threads), depth first."""
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            children = [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
        for child in children:
            found.append(child)
            found.extend(descendants(child))
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return b""
