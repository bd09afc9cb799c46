"""Two servers on one --log-dir (docs/design.md §2 "Budgets and hardening"): the second refuses to start, the first is untouched."""

from __future__ import annotations

import subprocess

from .conftest import EXE, free_port, http_get, start_server


def _second(log_dir) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EXE, "serve", "--model", "tiny-parrot", "--port", str(free_port()), "--log-dir", str(log_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_second_server_on_the_same_log_dir_refuses_with_one_clear_line(tmp_path):
    first = start_server(tmp_path)
    try:
        second = _second(first.log_dir)
        assert second.returncode == 2
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert "in use by another duplex-actors server" in lines[0]
        assert f"pid {first.proc.pid}" in lines[0]
        assert "Traceback" not in second.stdout + second.stderr
        assert http_get(first.base + "/ready")[0] == 200
    finally:
        first.stop()
    # The lock goes with the process: a new server takes the dir at once.
    again = start_server(tmp_path)
    try:
        assert http_get(again.base + "/ready")[0] == 200
    finally:
        again.stop()
